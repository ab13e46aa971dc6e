//! Reading a configuration file from disk, for both front ends (the main
//! file, every `include`, a `vigil.toml`, the checker's upstream source),
//! at start-up and on every reload.
//!
//! Only regular files are read (a symlink to one is fine): a device
//! (`include /dev/zero;` would read until memory runs out), a FIFO (the
//! read would wait for a writer for ever), a socket or a directory is
//! refused by name. A file larger than [`MAX_FILE_SIZE`] is refused too.
//! The type is checked before opening (opening a FIFO blocks) and again on
//! the opened file, and at most `MAX_FILE_SIZE + 1` bytes are ever read,
//! so a file that grows while it is read cannot take more. (A regular file
//! swapped for a FIFO between the check and the open would still block the
//! open; that needs write access to the configuration directory.)

use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::path::Path;

/// Largest configuration file read, in bytes (16 MiB; nginx has no limit).
pub const MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// The bytes of the regular file at `path` (see the module doc).
pub fn read_regular_file(path: &Path) -> io::Result<Vec<u8>> {
    regular(&fs::metadata(path)?)?;
    let file = File::open(path)?;
    let meta = file.metadata()?;
    regular(&meta)?;
    if meta.len() > MAX_FILE_SIZE {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_SIZE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_SIZE {
        return Err(too_large());
    }
    Ok(bytes)
}

fn too_large() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "larger than {} MiB, vigil's limit for a configuration file",
            MAX_FILE_SIZE >> 20
        ),
    )
}

fn regular(meta: &Metadata) -> io::Result<()> {
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    let what = if t.is_dir() {
        "a directory"
    } else {
        special_kind(&t)
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "it is {what}, not a regular file (vigil reads configuration only from regular files)"
        ),
    ))
}

#[cfg(unix)]
fn special_kind(t: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &fs::FileType) -> &'static str {
    "not a file"
}
