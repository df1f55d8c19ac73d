//! The two ends of `berth cp` as written, and where a copy lands.
//!
//! An argument is in a sandbox when it is `SANDBOX:PATH` or `:PATH` (as
//! `docker cp` reads `CONTAINER:PATH`); `-` is a tar archive on stdin or
//! stdout; anything else is a path on this machine. A path here with a
//! colon in it is written `./a:b` or absolute: sandbox names never hold a
//! `/` and never start with `.`.
//!
//! Where a copy lands follows `cp -a` and `docker cp`: onto an existing
//! directory it goes inside it under its own name, onto anything else it
//! takes the destination's name, and a directory's `SRC/.` means what is
//! in it rather than the directory itself.

use anyhow::{Result, bail};

/// One end of a copy, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// A path on this machine.
    Here(String),
    /// `-`: a tar archive on stdin (as SRC) or stdout (as DEST).
    Stdio,
    /// A path in a sandbox: the sandbox named before the colon, if any.
    Sandbox {
        /// The name before the colon; `None` for `:PATH`.
        name: Option<String>,
        /// The path after the colon; empty for the workspace.
        path: String,
    },
}

impl End {
    /// Read one argument.
    pub fn parse(arg: &str) -> Result<End> {
        if arg == "-" {
            return Ok(End::Stdio);
        }
        if arg.is_empty() {
            bail!("an empty path: name a file, `:PATH` in the sandbox, or `-`");
        }
        if arg.starts_with('/') || arg.starts_with('.') {
            return Ok(End::Here(arg.to_string()));
        }
        match arg.split_once(':') {
            Some((name, path)) if !name.contains('/') => {
                let name = if name.is_empty() {
                    None
                } else {
                    berth_core::backend::check_sandbox_name(name).map_err(|e| {
                        anyhow::anyhow!(
                            "`{arg}`: {e}. A path on this machine with a colon in it is written `./{arg}`"
                        )
                    })?;
                    Some(name.to_string())
                };
                Ok(End::Sandbox {
                    name,
                    path: path.to_string(),
                })
            }
            _ => Ok(End::Here(arg.to_string())),
        }
    }
}

/// What a path means besides where it is: `DIR/.` (or `.`) copies what is in
/// the directory, and a trailing `/` follows a link to a directory (as the
/// shell's own `cp` does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `DIR/.`: the directory's entries, not the directory.
    pub contents: bool,
    /// Written with a trailing `/` (or `/.`): a link to a directory is followed.
    pub follow: bool,
}

impl Shape {
    /// The shape of `path` as written.
    pub fn of(path: &str) -> Shape {
        let contents = path == "." || path.ends_with("/.");
        Shape {
            contents,
            follow: contents || path.ends_with('/'),
        }
    }
}

/// What is at a destination before the copy, as a probe found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A directory (or a link to one).
    Dir,
    /// Something that is not a directory: a file, a link, a FIFO.
    NotDir,
    /// Nothing, in a directory that exists.
    Nothing,
    /// Nothing, and its parent is not a directory either.
    NoParent,
}

/// What is copied, as a probe of the source found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory: copied recursively.
    Dir,
    /// A file, a link or anything else that is not a directory.
    Single,
}

/// Where a copy lands, in the destination's own terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// The source goes into directory `dir` under the name `name`.
    Named {
        /// An existing directory.
        dir: String,
        /// The name it takes there.
        name: String,
    },
    /// What is in the source directory goes into the existing directory `dir`.
    Into {
        /// An existing directory.
        dir: String,
    },
}

/// Where a source of `kind` and `shape`, called `base` (`None` for `/`),
/// lands at `dest` (absolute, normalised), where a probe found `found`.
/// `dest_text` is the destination as written: its trailing `/` matters.
pub fn landing(
    kind: Kind,
    shape: Shape,
    base: Option<&str>,
    dest: &str,
    dest_text: &str,
    found: Found,
) -> Result<Landing> {
    let (parent, name) = split(dest);
    let trailing = dest_text.ends_with('/') || dest_text.is_empty() || dest_text.ends_with("/.");
    match (kind, found) {
        (_, Found::NoParent) => bail!(
            "the destination's directory `{parent}` does not exist; create it first (`mkdir -p`), or copy to a directory that exists"
        ),
        (Kind::Dir, Found::NotDir) => bail!(
            "`{dest}` exists and is not a directory: a directory cannot be copied onto it; name a directory, or a new name"
        ),
        (Kind::Dir, Found::Dir) if shape.contents => Ok(Landing::Into {
            dir: dest.to_string(),
        }),
        (Kind::Dir, Found::Dir) => match base {
            Some(b) => Ok(Landing::Named {
                dir: dest.to_string(),
                name: b.to_string(),
            }),
            None => Ok(Landing::Into {
                dir: dest.to_string(),
            }),
        },
        (Kind::Dir, Found::Nothing) | (Kind::Single, Found::NotDir) => Ok(Landing::Named {
            dir: parent,
            name: name.to_string(),
        }),
        (Kind::Single, Found::Dir) => match base {
            Some(b) => Ok(Landing::Named {
                dir: dest.to_string(),
                name: b.to_string(),
            }),
            None => bail!("the source has no name to take in `{dest}`; name the file to write"),
        },
        (Kind::Single, Found::Nothing) if trailing => bail!(
            "the destination directory `{dest}` does not exist; create it first (`mkdir -p`), or drop the trailing `/` to copy the file to that name"
        ),
        (Kind::Single, Found::Nothing) => Ok(Landing::Named {
            dir: parent,
            name: name.to_string(),
        }),
    }
}

/// `path` (absolute, normalised, `/`-separated) as its directory and its
/// last name; `/` is its own directory with no name.
pub fn split(path: &str) -> (String, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".to_string(), name),
        Some((dir, name)) => (dir.to_string(), name),
        None => (".".to_string(), path),
    }
}

/// The last name of `path` (absolute, normalised); `None` for `/`.
pub fn base_name(path: &str) -> Option<&str> {
    let (_, name) = split(path);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_a_sandbox_only_with_a_colon_before_any_slash() -> Result<()> {
        let sb = |name: Option<&str>, path: &str| End::Sandbox {
            name: name.map(String::from),
            path: path.into(),
        };
        assert_eq!(End::parse(":data/")?, sb(None, "data/"));
        assert_eq!(End::parse(":")?, sb(None, ""));
        assert_eq!(End::parse("web:/var/log")?, sb(Some("web"), "/var/log"));
        assert_eq!(End::parse("web-1.b:x:y")?, sb(Some("web-1.b"), "x:y"));
        assert_eq!(End::parse("-")?, End::Stdio);
        assert_eq!(End::parse("./a:b")?, End::Here("./a:b".into()));
        assert_eq!(End::parse("/tmp/a:b")?, End::Here("/tmp/a:b".into()));
        assert_eq!(End::parse("dir/a:b")?, End::Here("dir/a:b".into()));
        assert_eq!(End::parse("report.txt")?, End::Here("report.txt".into()));
        let e = End::parse("bad name:x").err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("./bad name:x")));
        Ok(())
    }

    #[test]
    fn a_trailing_slash_follows_and_a_trailing_dot_means_the_contents() {
        let s = Shape::of("out/.");
        assert!(s.contents && s.follow);
        let s = Shape::of("link/");
        assert!(!s.contents && s.follow);
        let s = Shape::of("link");
        assert!(!s.contents && !s.follow);
        assert!(Shape::of(".").contents);
    }

    #[test]
    fn copies_land_as_cp_and_docker_cp_put_them() -> Result<()> {
        let plain = Shape::of("x");
        let named = |dir: &str, name: &str| Landing::Named {
            dir: dir.into(),
            name: name.into(),
        };
        let into = Landing::Into {
            dir: "/w/app".into(),
        };
        // (kind, shape, source name, target, as typed, what is there, landing)
        let lands = [
            // A file onto a directory goes inside it; onto a file or nothing, takes the name.
            (
                Kind::Single,
                plain,
                "a.csv",
                "/w/data",
                "data/",
                Found::Dir,
                named("/w/data", "a.csv"),
            ),
            (
                Kind::Single,
                plain,
                "a.csv",
                "/w/b.csv",
                "b.csv",
                Found::NotDir,
                named("/w", "b.csv"),
            ),
            (
                Kind::Single,
                plain,
                "a.csv",
                "/w/new",
                "new",
                Found::Nothing,
                named("/w", "new"),
            ),
            // A tree onto a directory goes inside; onto nothing, takes the name.
            (
                Kind::Dir,
                plain,
                "src",
                "/w/app",
                "app",
                Found::Dir,
                named("/w/app", "src"),
            ),
            (
                Kind::Dir,
                plain,
                "src",
                "/w/app",
                "app",
                Found::Nothing,
                named("/w", "app"),
            ),
            (
                Kind::Dir,
                Shape::of("src/."),
                "src",
                "/w/app",
                "app",
                Found::Dir,
                into,
            ),
        ];
        for (kind, shape, name, target, typed, found, want) in lands {
            assert_eq!(
                landing(kind, shape, Some(name), target, typed, found)?,
                want,
                "{typed}"
            );
        }
        // (kind, source name, target, as typed, what is there, the error says)
        let refused = [
            // A trailing slash promises a directory.
            (
                Kind::Single,
                "a",
                "/w/new",
                "new/",
                Found::Nothing,
                "does not exist",
            ),
            (
                Kind::Dir,
                "src",
                "/w/f",
                "f",
                Found::NotDir,
                "not a directory",
            ),
            (
                Kind::Single,
                "a",
                "/w/no/a",
                "no/a",
                Found::NoParent,
                "`/w/no` does not exist",
            ),
        ];
        for (kind, name, target, typed, found, says) in refused {
            let e = landing(kind, plain, Some(name), target, typed, found);
            assert!(e.is_err_and(|e| e.to_string().contains(says)), "{typed}");
        }
        Ok(())
    }

    #[test]
    fn paths_split_into_their_directory_and_name() {
        assert_eq!(split("/w/a"), ("/w".to_string(), "a"));
        assert_eq!(split("/a"), ("/".to_string(), "a"));
        assert_eq!(base_name("/"), None);
        assert_eq!(base_name("/w/a"), Some("a"));
    }
}
