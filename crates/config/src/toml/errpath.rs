//! A TOML error, said with the field path it is at: serde's schema errors
//! carry a byte span but no path, so the path is found by walking the
//! parsed document for the key or value under the span.

use std::ops::Range;
use std::path::Path;

use ::toml::de::{DeArray, DeTable, DeValue};
use ::toml::Spanned;

use super::at::push_key;
use crate::ConfigError;

/// `ConfigError::Toml` for `e`: `upstream.api.server[1].wieght: unknown
/// field ... (line 7, column 1)`.
pub(super) fn toml_error(src: &str, file: &Path, e: &::toml::de::Error) -> ConfigError {
    let message = match e.span() {
        Some(span) => {
            let (line, col) = line_col(src, span.start);
            match field_path(src, &span) {
                Some(path) => format!(
                    "{path}: {} (line {line}, column {col})",
                    e.message().trim_end()
                ),
                None => format!("{} (line {line}, column {col})", e.message().trim_end()),
            }
        }
        None => e.message().trim_end().to_string(),
    };
    ConfigError::Toml {
        path: file.to_path_buf(),
        message,
    }
}

/// 1-based line and column (in characters) of byte offset `pos`.
pub(super) fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let before = src.get(..pos).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The dotted path of the smallest key or value whose span holds `span`.
fn field_path(src: &str, span: &Range<usize>) -> Option<String> {
    let doc = DeTable::parse(src).ok()?;
    let mut best = Best {
        pos: span.start,
        found: None,
    };
    best.table(doc.get_ref(), "");
    best.found.map(|(_, path)| path)
}

struct Best {
    pos: usize,
    /// Span length and path of the best match so far.
    found: Option<(usize, String)>,
}

impl Best {
    fn table(&mut self, t: &DeTable<'_>, path: &str) {
        for (k, v) in t {
            let mut p = path.to_string();
            if !p.is_empty() {
                p.push('.');
            }
            push_key(&mut p, k.get_ref());
            self.consider(k.span(), &p);
            self.value(v, &p);
        }
    }

    fn array(&mut self, a: &DeArray<'_>, path: &str) {
        for (i, v) in a.iter().enumerate() {
            self.value(v, &format!("{path}[{i}]"));
        }
    }

    fn value(&mut self, v: &Spanned<DeValue<'_>>, path: &str) {
        self.consider(v.span(), path);
        match v.get_ref() {
            DeValue::Table(t) => self.table(t, path),
            DeValue::Array(a) => self.array(a, path),
            _ => {}
        }
    }

    /// Keep `path` if `span` holds the error and is no larger than the best
    /// so far (ties go to the deeper path, visited later).
    fn consider(&mut self, span: Range<usize>, path: &str) {
        let holds = span.start <= self.pos && (self.pos < span.end || span.start == span.end);
        let len = span.end - span.start;
        if holds && self.found.as_ref().is_none_or(|(best, _)| len <= *best) {
            self.found = Some((len, path.to_string()));
        }
    }
}
