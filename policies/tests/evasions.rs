//! Issue 32, item 8: commands that run other commands (wrappers, options and
//! variables that hold a command string) are read through, so a user's
//! `deny rm` sees the `rm` inside them; a command string berth cannot read
//! exactly is opaque, never a plain allow that claims it was read.
#![allow(clippy::expect_used, clippy::unwrap_used)] // in tests a panic is the failure report

use berth_policies::{Action, Policy, Verdict};

const DENY_RM: &str = "[[rules]]\nname = \"no-rm\"\naction = \"deny\"\nprefix = \"rm\"\n";

fn policy(text: &str) -> Policy {
    Policy::from_toml(text, "test.toml").expect("valid policy")
}

fn failures(p: &Policy, cmds: &[&str], ok: impl Fn(&Verdict) -> bool) -> Vec<String> {
    cmds.iter()
        .filter_map(|cmd| {
            let v = p.rules.check(cmd, "local");
            (!ok(&v)).then(|| format!("{cmd:?}: {v}"))
        })
        .collect()
}

/// Each of these runs `rm` in a way that can be read exactly: `deny rm` must
/// deny it by name.
#[test]
fn wrapped_and_embedded_rm_meets_deny_rm() {
    let p = policy(DENY_RM);
    let cmds = [
        // Prompt expansion of a known value.
        "x='rm -rf /tmp/y'; ${x@P}",
        "x=rm; \"${x@P}\" -rf /tmp/y",
        "x='$(rm -rf /tmp/y)'; echo ${x@P}",
        // Wrappers that run their argv.
        "setpriv --reuid=0 rm -rf x",
        "setpriv --reuid 0 --clear-groups rm x",
        "prlimit --nofile=10 rm x",
        "prlimit -p 1 --nofile=10 -- rm x",
        "fakeroot rm x",
        "fakeroot -- rm x",
        "fakeroot -s state rm x",
        "chrt 10 rm x",
        "chrt -f 10 rm x",
        "ionice -c3 rm x",
        "ionice -c 2 -n 7 rm x",
        "nice -n 5 rm x",
        "taskset -c 0-3 rm x",
        "taskset 0x1 rm x",
        "numactl --cpunodebind=0 rm x",
        "numactl -N 0 -m 0 rm x",
        "unshare -r rm x",
        "unshare --map-user=0 -m rm x",
        "nsenter -t 1 -m rm x",
        "chroot / rm x",
        "chroot --userspec=1:1 / rm x",
        "runuser -u agent rm x",
        "runuser -u agent -- rm x",
        "runuser agent -c 'rm x'",
        "sg wheel 'rm x'",
        "sg wheel -c 'rm x'",
        "flock /tmp/l rm x",
        "stdbuf -oL rm x",
        "timeout 5 rm x",
        "timeout -k 1 5 rm x",
        "time rm x",
        "strace -f rm x",
        "strace -o log -e trace=file rm x",
        "ltrace -o log rm x",
        "valgrind --leak-check=full rm x",
        "watch rm x",
        "script -qc 'rm x' /dev/null",
        "su -c 'rm x'",
        "busybox rm x",
        "firejail --noprofile rm x",
        "systemd-run --user -p MemoryMax=1G rm x",
        "capsh -- -c 'rm x'",
        "eatmydata rm x",
        "setarch x86_64 -R rm x",
        "linux64 rm x",
        "faketime '2020-01-01' rm x",
        "catchsegv rm x",
        "xvfb-run -a rm x",
        "dbus-run-session -- rm x",
        "perf stat -e cycles rm x",
        "setsid -f rm x",
        "ssh host rm x",
        "ssh -p 2222 -i key user@host 'rm -rf x'",
        "ssh -o StrictHostKeyChecking=no host -- rm x",
        // Variables bash or a program runs as code.
        "env BASH_FUNC_foo%%='() { rm -rf x; }' bash -c foo",
        "env 'BASH_FUNC_foo()=() { rm x; }' bash -c foo",
        "sudo BASH_FUNC_foo%%='() { rm x; }' bash -c foo",
        "env SHELLOPTS=xtrace PS4='$(rm x)' bash -c :",
        "PS4='$(rm x)' bash -xc :",
        "PROMPT_COMMAND='rm x' bash -i",
        "GIT_SSH_COMMAND='rm x' git fetch",
        "env GIT_SSH_COMMAND='rm x' git fetch",
        "export GIT_SSH_COMMAND='rm x'",
        "GIT_PAGER='rm x' git log",
        "GIT_EDITOR='rm x' git commit",
        "PAGER='rm x' man ls",
        "EDITOR='rm x' crontab -e",
        "LESSOPEN='|rm x %s' less f",
        "LESSOPEN='||rm x %s' less f",
        "RSYNC_RSH='rm x' rsync a h:b",
        "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.x GIT_CONFIG_VALUE_0='!rm y' git x",
        "env GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0='rm y' git log",
        "GIT_CONFIG_PARAMETERS=\"'alias.x'='!rm y'\" git x",
        // sed's `e` command runs its argument.
        "sed 'e rm x' f",
        "sed -e '1e rm x' f",
        "sed --expression='e rm x' f",
        "sed -n '/a/e rm x' f",
        "sed -i '$e rm x' f",
        "sed '1{e rm x\n}' f",
        "sed 's/.*/rm x/e' f",
        "sed 's/^.*$/rm x/e' f",
        // git aliases and command-valued configuration.
        "git -c alias.x='!rm -rf y' x",
        "git -c alias.x=!sh x -c 'rm y'",
        "git -c alias.x='!rm' x -rf y",
        "git -c alias.x='!rm -rf y' status",
        "git -c core.sshCommand='rm y' fetch",
        "git -c core.pager='rm y' log",
        "git -c core.editor='rm y' commit",
        "git -c diff.external='rm y' diff",
        "git -c credential.helper='!rm y' push",
        "git -c filter.x.smudge='rm y' checkout .",
        "git -c Core.SSHCommand='rm y' fetch",
        "git config alias.x '!rm -rf y'",
        "git config --global alias.x '!rm -rf y'",
        "git config set alias.x '!rm y'",
        "git config core.pager 'rm y'",
        "git config --add core.sshCommand 'rm y'",
        // tar options that run commands.
        "tar --checkpoint-action=exec=rm x",
        "tar -cf a.tar --checkpoint=1 --checkpoint-action=exec='rm x' .",
        "tar --checkpoint-action 'exec=rm x' -cf a.tar .",
        "tar --to-command='rm x' -xf a.tar",
        "tar --to-command 'rm x' -xf a.tar",
        "tar --to-comm='rm x' -xf a.tar",
        "tar --use-compress-program='rm x' -cf a.tar .",
        "tar --use-compress-program 'rm x' -cf a.tar .",
        "tar -I 'rm x' -cf a.tar .",
        "tar -Irm -cf a.tar .",
        "tar -cI rm -f a.tar .",
        "tar -cvI 'rm x' -f a.tar .",
        "tar cfI a.tar rm .",
        "tar --info-script='rm x' -cf a.tar .",
        "tar -F 'rm x' -cf a.tar .",
        "tar --new-volume-script='rm x' -cf a.tar .",
        "tar --rsh-command='rm x' -cf h:a.tar .",
        // Other options that hold a command.
        "find . -exec rm {} \\;",
        "find . -okdir rm {} \\;",
        "find . -execdir sh -c 'rm \"$1\"' _ {} \\;",
        "rsync -e 'rm x' a h:b",
        "rsync -ave 'rm x' a h:b",
        "rsync --rsh='rm x' a h:b",
        "rsync --rsh 'rm x' a h:b",
        "rsync --rsync-path='rm x' a h:b",
        "vim -c '!rm x' f",
        "vim +'!rm x' f",
        "vi -c ':!rm x'",
        "nvim --cmd '!rm x'",
        "ex -c '!rm x' f",
        "zip -T -TT 'rm x' a.zip f",
        "zip a.zip f -T --unzip-command 'rm x'",
        "zip a.zip f -T --unzip-command='rm x'",
        "parallel rm ::: a b",
        "parallel 'rm {}' ::: a b",
        "parallel -j4 rm -rf ::: a b",
        "xargs rm < list",
        // Siblings: ssh's local commands, pagers, preprocessors, file finders.
        "ssh -o ProxyCommand='rm x' host",
        "ssh -oProxyCommand='rm x' host",
        "scp -o 'ProxyCommand=rm x' a host:b",
        "sftp -o LocalCommand='rm x' -o PermitLocalCommand=yes host",
        "rsync -e \"ssh -o ProxyCommand='rm x'\" a h:b",
        "man -P 'rm x' ls",
        "man --pager='rm x' ls",
        "rg --pre 'rm' pattern",
        "rg --pre=rm pattern",
        "fd -e txt -x rm",
        "fd --exec-batch rm -rf",
        // Project runners that run their argv.
        "uv run rm x",
        "uv run --with requests -- rm x",
        "poetry run rm x",
        "pipenv run rm x",
        "pdm run rm x",
        "hatch run rm x",
        "conda run -n base rm x",
        "bundle exec rm x",
        "direnv exec . rm x",
        "nix develop -c rm x",
        "nix shell nixpkgs#hello -c rm x",
        "nix-shell --run 'rm x'",
        "npx rm x",
        "npx -y -p pkg rm x",
        "npx -c 'rm x'",
        "npm exec -- rm x",
        "npm exec -c 'rm x'",
        "pnpm exec rm x",
        "pnpm dlx rm x",
        "yarn exec rm x",
        // Programs that take a command string.
        "hyperfine 'rm x'",
        "hyperfine --warmup 3 'rm x'",
        "watchexec -- rm x",
        "watchexec -e rs 'rm x'",
        "nodemon --exec 'rm x'",
        "entr rm x < files",
        "entr -s 'rm x' < files",
        "tmux new-session -d 'rm x'",
        "tmux new-window 'rm x'",
        "screen -dmS s rm x",
        "cargo watch -s 'rm x'",
        // awk's command strings, when they are literals.
        "awk 'BEGIN { system(\"rm x\") }'",
        "gawk 'BEGIN{system( \"rm -rf y\" )}'",
        "awk '{ print | \"rm x\" }' f",
        "awk 'BEGIN { while ((\"rm x\" | getline l) > 0) print l }'",
        // Privilege and sandbox-crossing launchers.
        "pkexec rm x",
        "pkexec --user root rm x",
        "run0 rm x",
        "run0 -u root --chdir=/ rm x",
        "flatpak-spawn --host rm x",
        "cpulimit -l 50 rm x",
        "cpulimit -l 50 -- rm x",
        "ssh-agent rm x",
        "toolbox run rm x",
        "distrobox enter box -- rm x",
        "docker exec c rm x",
        "docker exec -it -u root -w /app c rm x",
        "podman exec c rm x",
        "kubectl exec pod -- rm x",
        "kubectl exec -it pod -c app -- rm x",
    ];
    let bad = failures(&p, &cmds, |v| v.action == Action::Deny && v.rule == "no-rm");
    assert!(
        bad.is_empty(),
        "{} not denied by no-rm:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Command strings berth cannot read exactly are opaque: the policy's opaque
/// verdict, never a plain allow from the default rule.
#[test]
fn unreadable_command_strings_are_opaque() {
    let cmds = [
        "echo ${x@P}",
        "${x@P}",
        "echo \"${a[0]@P}\"",
        "sed 's/a/b/e' f",
        "sed e f",
        "sed '1e' f",
        "sed -n 's/x/&/ep' f",
        "sed \"e $c\" f",
        "git -c alias.x=\"!$cmd\" x",
        "git -c alias.x=!sh x",
        "awk '{ print | \"sh\" }' cmds",
        "awk 'BEGIN { system(\"rm \" ARGV[1]) }' x",
        "awk '{ print | cmd }' f",
        "git --config-env=alias.x=CMD x",
        "git --config-env=core.sshCommand=CMD fetch",
        "tar --to-command=\"$c\" -xf a.tar",
        "setpriv $c x",
        "timeout 5 $c x",
        "vim -c 'call system(\"rm x\")' f",
        "vim -c 'r !rm x' f",
        "make --eval='x: ; rm y' x",
        "make -E 'x: ; rm y' x",
        "PS4=\"$p\" bash -xc :",
        "GIT_SSH_COMMAND=\"$c\" git fetch",
        "echo rm | xargs -I{} {} f",
        "echo rm | xargs -I % % f",
        "find /bin -name rm -exec {} f \\;",
        "cat cmds | parallel",
        "parallel < cmds",
        // A command string a program (not bash) takes apart, that does not
        // read as shell: opaque, not refused as unparsable.
        "git -c core.pager=\"less '\" log",
        "LESSOPEN=\"|cat '%s\" less f",
        "PS1='$(( ' bash -i",
    ];
    let ask = policy(&format!("opaque = \"ask\"\n{DENY_RM}"));
    let bad = failures(&ask, &cmds, |v| {
        v.action >= Action::Ask && (v.rule == "opaque" || v.rule == "no-rm")
    });
    assert!(
        bad.is_empty(),
        "{} not opaque:\n{}",
        bad.len(),
        bad.join("\n")
    );
    // Under the built-in opaque = allow they run, but as `opaque`.
    let allow = policy(DENY_RM);
    let bad = failures(&allow, &cmds, |v| v.rule == "opaque" || v.rule == "no-rm");
    assert!(
        bad.is_empty(),
        "{} claimed read:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The `standard` profile's ask tier sees through the same wrappers.
#[test]
fn wrappers_do_not_skip_the_standard_ask_tier() {
    let p = policy("profile = \"standard\"\n");
    let cmds = [
        "setpriv git reset --hard",
        "prlimit --nofile=10 git reset --hard",
        "fakeroot git clean -fd",
        "strace -f git push --force",
        "unshare -r rm -rf build",
        "git -c alias.x='reset --hard' x",
        "git -c alias.nuke='!git reset --hard' nuke",
        "ssh host git reset --hard",
        "tar --to-command='git reset --hard' -xf a.tar",
    ];
    let bad = failures(&p, &cmds, |v| {
        v.action == Action::Ask && v.rule.starts_with("standard:")
    });
    assert!(
        bad.is_empty(),
        "{} not asked:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The same programs in their ordinary uses stay allowed, even where opaque
/// commands are asked about.
#[test]
fn ordinary_uses_of_these_programs_stay_allowed() {
    let p = policy(&format!("opaque = \"ask\"\n{DENY_RM}"));
    let cmds = [
        "sed 's/e/x/' f",
        "sed -e 's/a/b/g' -e '/^$/d' f",
        "sed -n '/start/,/end/p' f",
        "sed -i.bak 's/exec/run/g' f",
        "sed '1i header' f",
        "sed '/x/a\\\nline' f",
        "sed 's/x/y/w out.txt' f",
        "sed 'y/abc/xyz/' f",
        "sed -E 's/(a|b)+/c/2g' f",
        "sed '/^#/d;s/[[:space:]]*$//' f",
        "sed -n '$p' f",
        "sed ':a;N;$!ba;s/\\n/ /g' f",
        "sed '/re/{s/a/b/;s/c/d/}' f",
        "sed 's|/usr/local|/opt|g' f",
        "sed 's/echo/printf/' f",
        "git -c color.ui=always log",
        "git -c core.pager=cat log",
        "git -c user.name=x -c user.email=y commit -m m",
        "git -c alias.st=status st",
        "git config core.editor vim",
        "git config user.name 'A B'",
        "git config --get alias.st",
        "tar -czf a.tgz src",
        "tar xf a.tar",
        "tar -xzvf a.tgz -C out",
        "tar -I zstd -cf a.tar.zst .",
        "tar --use-compress-program='zstd -19' -cf a.tar.zst .",
        "tar cf - . | ssh host tar xf -",
        "rsync -e 'ssh -p 2222' -av a h:b",
        "rsync -avz --delete src/ dst/",
        "zip -r a.zip d",
        "zip -T a.zip f",
        "vim -c 'set nu' f",
        "vim +10 f",
        "vim -c 'wq' f",
        "nice -n 10 make",
        "timeout 60 pytest",
        "strace -f -o log ./app",
        "ssh host uptime",
        "ssh -i key -p 2222 user@host 'ls -la'",
        "ssh host",
        "parallel gzip ::: a.txt b.txt",
        "GIT_PAGER=cat git log",
        "LESSOPEN='| lesspipe %s' less f",
        "PAGER=cat man ls",
        "EDITOR=vim git commit",
        "export EDITOR=nano",
        "PS1='\\u@\\h:\\w\\$ '",
        "export PS1='$(git branch 2>/dev/null) $ '",
        "setpriv --reuid=1000 id",
        "prlimit --nofile=1024 ./server",
        "fakeroot dpkg-deb --build pkg",
        "unshare -r id",
        "make -j4 all",
        "echo a | xargs -I{} echo {}",
        "find . -name '*.o' -exec ls {} +",
        "ssh -o StrictHostKeyChecking=no host ls",
        "man -P cat ls",
        "rg --pre-glob '*.gz' x",
        "fd -e rs -x wc -l",
        "uv run pytest -q",
        "poetry run pytest -q",
        "bundle exec rspec",
        "npx prettier --check .",
        "npm exec -- eslint .",
        "pnpm exec tsc",
        "nix develop -c cargo build",
        "hyperfine 'sleep 0.1'",
        "tmux new-session -d -s dev",
        "tmux ls",
        "cargo watch -x check",
        "tmux send-keys -t dev 'npm run dev' Enter",
        "npx tsc -c tsconfig.json",
        "npm run build -- -c prod",
        "tar -cvsf a.tar src",
        "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=user.name GIT_CONFIG_VALUE_0=bot git commit -m x",
        "docker exec -it c ls",
        "kubectl exec -it pod -- ls",
        "docker ps",
        "awk '{print $1}' f",
        "awk 'BEGIN { system(\"date\") }'",
        "git -c core.hooksPath=.githooks commit -m x",
    ];
    let bad = failures(&p, &cmds, |v| v.action == Action::Allow);
    assert!(bad.is_empty(), "{} refused:\n{}", bad.len(), bad.join("\n"));
}

/// The reader's limits hold inside command strings too: text nested past
/// them is refused, not waved through as opaque.
#[test]
fn limits_hold_inside_command_strings() {
    let deep = format!(
        "git -c alias.x='!{}a{}' x",
        "echo $(".repeat(40),
        ")".repeat(40)
    );
    let v = policy(DENY_RM).rules.check(&deep, "local");
    assert_eq!(
        (v.action, v.rule.as_str()),
        (Action::Deny, "unparsable"),
        "{v}"
    );
}
