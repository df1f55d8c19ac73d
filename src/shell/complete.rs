//! Tab completion for `berth shell`, answered by the sandbox's own bash.
//!
//! Flow at a glance:
//! 1. [`Word::at`] finds the word under the cursor and what kind it is: a
//!    command name (first word of a pipeline), a `$variable`, or a path;
//! 2. [`Word::script`] builds a `compgen` line for it, which the session runs
//!    like any command (so it sees the session's cwd, `PATH`, functions and
//!    aliases, on every backend) and which leaves `$?` as it found it;
//! 3. [`Word::candidates`] turns compgen's lines into what the editor inserts:
//!    directories end in `/`, special characters are escaped with `\`.

/// The most candidates one completion asks for.
const MAX_CANDIDATES: usize = 500;

/// What the word under the cursor names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The first word of a command: builtins, functions, aliases, programs.
    Command,
    /// A `$NAME`.
    Variable,
    /// Anything else: a file or directory.
    Path,
}

/// The word being completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Word {
    /// Byte offset of the word's start in the line.
    pub start: usize,
    /// The word's text up to the cursor.
    pub text: String,
    /// What it names.
    pub kind: Kind,
}

/// Characters that end a word for completion.
fn breaks_word(c: char) -> bool {
    c.is_whitespace() || matches!(c, ';' | '|' | '&' | '(' | ')' | '<' | '>' | '`')
}

impl Word {
    /// The word that ends at `pos` in `line`.
    pub fn at(line: &str, pos: usize) -> Word {
        let pos = pos.min(line.len());
        let head = line.get(..pos).unwrap_or(line);
        // The word starts after the last break that no `\` escapes.
        let mut start = 0;
        let mut escaped = false;
        for (i, c) in head.char_indices() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if breaks_word(c) {
                start = i + c.len_utf8();
            }
        }
        let text = head[start..].to_string();
        let before = head[..start].trim_end();
        let command_position =
            before.is_empty() || before.ends_with([';', '|', '&', '(', '`']) || before == "sudo";
        let kind = if text.starts_with('$') && !text.contains('/') {
            Kind::Variable
        } else if command_position && !text.contains('/') {
            Kind::Command
        } else {
            Kind::Path
        };
        Word { start, text, kind }
    }

    /// The bash line that prints this word's candidates, one a line, and
    /// then leaves `$?` at `last_status`. Under `set -e` a non-zero status
    /// would end the shell, so there it is left at 0.
    pub fn script(&self, last_status: i32) -> String {
        let list = match self.kind {
            Kind::Command => format!("compgen -c -- {}", quote(&self.text)),
            Kind::Variable => format!("compgen -v -- {}", quote(&self.text[1..])),
            Kind::Path => format!(
                "compgen -f -- {} | while IFS= read -r __berth_f; do \
                 if [ -d \"$__berth_f\" ]; then printf '%s/\\n' \"$__berth_f\"; \
                 else printf '%s\\n' \"$__berth_f\"; fi; done",
                // Undo `escape` on a typed word, so `my\ dir/` is looked up as
                // `my dir/`.
                quote(&rustyline::completion::unescape(&self.text, Some('\\')))
            ),
        };
        let restore = match last_status.clamp(0, 255) {
            0 => String::new(),
            _ => format!("; {}", set_status(last_status)),
        };
        format!(
            "{{ {list}; }} 2>/dev/null | {{ head -n {MAX_CANDIDATES}; cat >/dev/null; }} || :{restore}"
        )
    }

    /// Candidates from compgen's output: (what the list shows, what replaces the word).
    pub fn candidates(&self, output: &str) -> Vec<(String, String)> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for line in output.lines().filter(|l| !l.is_empty()) {
            if !seen.insert(line.to_string()) {
                continue;
            }
            let pair = match self.kind {
                // A finished word gets its space, as in bash; a directory does not.
                Kind::Command => (line.to_string(), format!("{} ", escape(line))),
                Kind::Variable => (format!("${line}"), format!("${line}")),
                Kind::Path => {
                    let trimmed = line.strip_suffix('/').unwrap_or(line);
                    let base = match trimmed.rfind('/') {
                        Some(i) => &line[i + 1..],
                        None => line,
                    };
                    let space = if line.ends_with('/') { "" } else { " " };
                    (base.to_string(), format!("{}{space}", escape(line)))
                }
            };
            out.push(pair);
        }
        out
    }
}

/// The bash line that leaves `$?` at `status` (0 to 255). Under `set -e` a
/// non-zero status would end the shell, so there it leaves `$?` alone.
pub fn set_status(status: i32) -> String {
    let status = status.clamp(0, 255);
    format!("case $- in *e*) ;; *) (exit {status}) ;; esac")
}

/// `s` in single quotes for bash.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A word with bash's special characters escaped by `\`, as typed at a prompt.
/// (Not rustyline's `completion::escape`: that one escapes a set of
/// characters wherever they stand, and a leading `~` must stay unescaped so
/// `~/src` is still a home path; a later one is escaped.)
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        let special = matches!(
            c,
            ' ' | '\t'
                | '\''
                | '"'
                | '\\'
                | '$'
                | '`'
                | '&'
                | ';'
                | '|'
                | '('
                | ')'
                | '<'
                | '>'
                | '*'
                | '?'
                | '['
                | ']'
                | '#'
                | '!'
                | '{'
                | '}'
        ) || (c == '~' && i > 0);
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_is_a_command_and_later_words_are_paths() {
        assert_eq!(Word::at("ec", 2).kind, Kind::Command);
        assert_eq!(Word::at("ls sr", 5).kind, Kind::Path);
        assert_eq!(
            Word::at("ls sr", 5),
            Word {
                start: 3,
                text: "sr".into(),
                kind: Kind::Path
            }
        );
        assert_eq!(Word::at("make && ca", 10).kind, Kind::Command);
        assert_eq!(Word::at("cat x | gr", 10).kind, Kind::Command);
        assert_eq!(Word::at("./scr", 5).kind, Kind::Path);
        assert_eq!(Word::at("echo $HO", 8).kind, Kind::Variable);
        assert_eq!(Word::at("", 0).kind, Kind::Command);
    }

    #[test]
    fn the_word_ends_at_the_cursor() {
        let w = Word::at("ls src/ma other", 9);
        assert_eq!(w.text, "src/ma");
        assert_eq!(w.start, 3);
    }

    #[test]
    fn paths_show_their_last_part_and_directories_end_in_a_slash() {
        let w = Word::at("cat src/m", 9);
        let c = w.candidates("src/main.rs\nsrc/my dir/\nsrc/main.rs\n");
        assert_eq!(
            c,
            vec![
                ("main.rs".to_string(), "src/main.rs ".to_string()),
                ("my dir/".to_string(), r"src/my\ dir/".to_string()),
            ]
        );
    }

    #[test]
    fn an_escaped_word_is_looked_up_unescaped_and_quoted() {
        let w = Word::at(r"cat my\ d", 9);
        assert_eq!(w.text, r"my\ d");
        assert!(
            w.script(0).contains("compgen -f -- 'my d'"),
            "{}",
            w.script(0)
        );
        let w = Word::at("cat it's", 8);
        assert!(w.script(0).contains(r"'it'\''s'"), "{}", w.script(0));
    }

    #[test]
    fn the_script_puts_back_a_non_zero_status() {
        let w = Word::at("ec", 2);
        assert!(!w.script(0).contains("exit"));
        assert!(
            w.script(3).ends_with("*) (exit 3) ;; esac"),
            "{}",
            w.script(3)
        );
    }

    #[test]
    fn variables_complete_with_their_dollar() {
        let w = Word::at("echo $HO", 8);
        assert!(w.script(0).contains("compgen -v -- 'HO'"));
        assert_eq!(
            w.candidates("HOME\nHOSTNAME\n"),
            vec![
                ("$HOME".to_string(), "$HOME".to_string()),
                ("$HOSTNAME".to_string(), "$HOSTNAME".to_string())
            ]
        );
    }
}
