//! Issue 32 item 7: a snapshot is replayed only when it restores state and
//! runs nothing, since commands in the sandbox can edit it.

use berth_policies::shell::declarations_only;

/// A snapshot as the loop writes it: the functions file, the snapshot, a
/// journal record and the counters the engine adds.
const SNAPSHOT: &str = r#"# berth functions seq=3
greet () 
{ 
    rm -rf "$1";
    echo "hi $(whoami)" > /tmp/x
}
declare -fx greet
# berth functions end seq=3
# berth snapshot v3 seq=4 functions=3
__berth_seq=4 __berth_ds=3 __berth_dn=1
builtin cd -- /tmp/a\ b 2>/dev/null || builtin cd -- "$__berth_work" 2>/dev/null
declare -x HOME="/root"
declare -x PAGER="cat"
declare -x ODD="\$(rm -rf /) \`id\` \"q\""
declare -x MULTI="a
b"
declare -x EMPTY
# berth journal base=4 seq=5
__berth_seq=5
builtin cd -- '/tmp' 2>/dev/null || builtin cd -- "$__berth_work" 2>/dev/null
declare -x A='1'
builtin unset -v B
# berth journal end seq=5
__berth_sb=0 __berth_base=4
# berth aliases
alias ll='rm -rf /'
alias la='ls -a'
# berth snapshot end seq=4
"#;

#[test]
fn what_the_loop_writes_is_replayed() {
    assert_eq!(declarations_only(SNAPSHOT), Ok(()));
    // Exports as bash prints them in POSIX mode.
    assert_eq!(declarations_only("export HOME=\"/root\"\n"), Ok(()));
}

#[test]
fn a_command_added_to_a_snapshot_keeps_it_from_being_replayed() {
    let added =
        |line: &str| SNAPSHOT.replace("# berth aliases\n", &format!("{line}\n# berth aliases\n"));
    for line in [
        "rm keep",
        "ll",
        "declare -x A=\"$(rm keep)\"",
        "A=`rm keep`",
        "declare -x A=1; rm keep",
        "declare -x A=1 && rm keep",
        "builtin cd /tmp > /etc/passwd",
        "builtin cd /tmp < /etc/shadow",
        "builtin eval rm keep",
        "export A=1 | rm keep",
        "( rm keep )",
        "{ rm keep; }",
        "if true; then rm keep; fi",
        "declare -x A=<(rm keep)",
        "$X",
        "cat <<EOF\n$(rm keep)\nEOF",
    ] {
        let got = declarations_only(&added(line));
        assert!(got.is_err(), "{line:?} was let through");
    }
    // The refusal names what does not belong.
    let got = declarations_only(&added("rm keep"));
    assert!(
        got.as_ref().is_err_and(|e| e.contains("rm keep")),
        "{got:?}"
    );
}

#[test]
fn an_alias_value_is_code_for_later_but_a_substitution_in_its_word_runs_now() {
    assert_eq!(declarations_only("alias ll='rm -rf / $(rm x)'\n"), Ok(()));
    assert!(declarations_only("alias ll=$(rm x)\n").is_err());
    assert!(declarations_only("alias ll=\"$(rm x)\"\n").is_err());
}

#[test]
fn a_variable_the_gate_reads_as_a_command_is_only_set() {
    assert_eq!(
        declarations_only(
            "declare -x PAGER=\"cat\"\ndeclare -x GIT_PAGER=\"less -R\"\nEDITOR=vi\n"
        ),
        Ok(())
    );
    assert!(declarations_only("declare -x PAGER=$(rm x)\n").is_err());
}
