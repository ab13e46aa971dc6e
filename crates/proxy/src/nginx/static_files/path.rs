//! A URI's file name (nginx's ngx_http_map_uri_to_path) and what vigil
//! refuses to open: a name with a NUL, or one whose part taken from the
//! request climbs above the root with `..`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A file name: the root (or alias) part and the part taken from the URI.
pub(super) struct FileName {
    /// The whole name.
    pub(super) bytes: Vec<u8>,
    /// Where the part after the root starts.
    pub(super) root_len: usize,
}

impl FileName {
    /// `root` followed by `rest`.
    pub(super) fn join(root: Vec<u8>, rest: &[u8]) -> Self {
        let root_len = root.len();
        let mut bytes = root;
        bytes.extend_from_slice(rest);
        Self { bytes, root_len }
    }

    /// The name as a path.
    pub(super) fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.bytes))
    }

    /// The name as nginx writes it in a log line.
    pub(super) fn display(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }

    /// Whether vigil may open it: no NUL (nginx's names are C strings,
    /// cut there), and no `..` component at or after the one where the
    /// root ends (an alias without its slash, `location /i { alias
    /// /srv/img/; }` and `/i../x`, or a variable's `..`: nginx opens
    /// those, vigil does not).
    pub(super) fn is_safe(&self) -> bool {
        if self.bytes.contains(&0) {
            return false;
        }
        // The component the root's end falls in when the request's part
        // continues it, and every one after the root.
        let (root, rest) = self.bytes.split_at(self.root_len);
        let from = if rest.is_empty() || rest[0] == b'/' || root.last() == Some(&b'/') {
            self.root_len
        } else {
            root.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1)
        };
        !self.bytes[from..].split(|&b| b == b'/').any(|c| c == b"..")
    }
}

#[cfg(test)]
mod tests {
    use super::FileName;

    fn safe(root: &str, rest: &str) -> bool {
        FileName::join(root.as_bytes().to_vec(), rest.as_bytes()).is_safe()
    }

    #[test]
    fn a_name_below_the_root_is_safe() {
        assert!(safe("/srv/www", "/a/b.html"));
        assert!(
            safe("/srv/../www", "/a"),
            "the root's own dots are the operator's"
        );
        assert!(safe("/srv/..", "/a"));
        assert!(safe("/srv/img/", "..x"));
        assert!(safe("/srv/img/", "x.."));
    }

    #[test]
    fn dots_from_the_request_or_a_nul_are_not() {
        assert!(!safe("/srv/img/", "../etc/passwd"));
        assert!(!safe("/srv/img", "/a/../../x"));
        assert!(!safe("/srv/img", "/.."));
        assert!(!safe("/srv/img/", ".."));
        assert!(!safe("/srv/www", "/a\0.html"));
    }
}
