//! Atomic file replacement in the render directory: write a temporary file
//! beside the target, fsync it, rename it over the target, fsync the
//! directory. The previous content is kept as `NAME.conf.prev` and in
//! memory, so a failed `nginx -t` puts it back. Temporary and `.prev`
//! names never end in `.conf`, so an `include DIR/*.conf` does not see them.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::SyncError;

/// One file to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    /// The upstream's name.
    pub(crate) name: String,
    /// The content before (`None`: the file did not exist).
    pub(crate) old: Option<String>,
    /// The content after (`None`: remove the file).
    pub(crate) new: Option<String>,
}

/// `DIR/NAME.conf`.
pub(crate) fn conf_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.conf"))
}

/// The current content of `DIR/NAME.conf`, if any.
pub(crate) fn read(dir: &Path, name: &str) -> Result<Option<String>, SyncError> {
    let path = conf_path(dir, name);
    match fs::read_to_string(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SyncError::io(path, e)),
    }
}

/// Replace `path` with `content` atomically.
pub(crate) fn write_atomic(path: &Path, content: &str) -> Result<(), SyncError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(content.as_bytes())?;
        f.sync_all()?;
        Ok(())
    };
    write().map_err(|e| SyncError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| SyncError::io(path, e))?;
    sync_dir(dir);
    Ok(())
}

/// fsync a directory so that a rename survives a crash (best effort).
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Apply `changes`, keeping each previous file as `NAME.conf.prev`. On an
/// error part way, what was applied is rolled back.
pub(crate) fn apply(dir: &Path, changes: &[Change]) -> Result<(), SyncError> {
    for (i, c) in changes.iter().enumerate() {
        if let Err(e) = apply_one(dir, c) {
            rollback(dir, &changes[..=i]);
            return Err(e);
        }
    }
    Ok(())
}

fn apply_one(dir: &Path, c: &Change) -> Result<(), SyncError> {
    let path = conf_path(dir, &c.name);
    if let Some(old) = &c.old {
        write_atomic(&dir.join(format!("{}.conf.prev", c.name)), old)?;
    }
    match &c.new {
        Some(new) => write_atomic(&path, new),
        None => match fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(dir);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SyncError::io(path, e)),
        },
    }
}

/// Put the previous contents back (errors are logged: there is nothing
/// better to do with them).
pub(crate) fn rollback(dir: &Path, changes: &[Change]) {
    for c in changes {
        let path = conf_path(dir, &c.name);
        let result = match &c.old {
            Some(old) => write_atomic(&path, old),
            None => match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SyncError::io(&path, e)),
                _ => Ok(()),
            },
        };
        if let Err(e) = result {
            tracing::error!(error = %e, file = %path.display(), "rollback of a rendered file failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_keeps_prev_and_rollback_restores() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_atomic(&conf_path(d, "a"), "one\n").unwrap();
        let changes = vec![
            Change {
                name: "a".into(),
                old: Some("one\n".into()),
                new: Some("two\n".into()),
            },
            Change {
                name: "b".into(),
                old: None,
                new: Some("new\n".into()),
            },
        ];
        apply(d, &changes).unwrap();
        assert_eq!(read(d, "a").unwrap().as_deref(), Some("two\n"));
        assert_eq!(fs::read_to_string(d.join("a.conf.prev")).unwrap(), "one\n");
        rollback(d, &changes);
        assert_eq!(read(d, "a").unwrap().as_deref(), Some("one\n"));
        assert_eq!(read(d, "b").unwrap(), None);
        let names: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conf"))
            .collect();
        assert_eq!(names, vec!["a.conf".to_string()], "no stray *.conf");
    }
}
