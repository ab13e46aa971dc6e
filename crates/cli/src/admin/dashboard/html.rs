//! Small HTML helpers of the dashboard: escaping and times.
//!
//! Every text taken from configuration or state (upstream names, peer
//! addresses, explain sentences, event texts, probe details) goes through
//! [`esc`] before it is written into the page, in element text and in
//! double-quoted attribute values alike.

use std::fmt::{self, Write};

/// `s` with `& < > " '` written as character references: safe in element
/// text and in a double- or single-quoted attribute value.
pub(crate) fn esc(s: &str) -> Escaped<'_> {
    Escaped(s)
}

/// A string written escaped (see [`esc`]).
pub(crate) struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            let rep = match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            };
            f.write_str(rep)?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

/// `08:26:12 UTC` for Unix milliseconds (the dashboard shows the day's
/// time; the API has the full figure).
pub(crate) fn clock_time(unix_ms: u64) -> String {
    let s = unix_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// `1.23 ms` for microseconds (three significant digits).
pub(crate) fn micros(us: u64) -> String {
    vigil_core::clock::human_us(us)
}

/// Write formatted text into a `String` (never fails).
pub(crate) fn put(out: &mut String, args: fmt::Arguments<'_>) {
    let _ = out.write_fmt(args);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#).to_string(),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(esc("plain µs").to_string(), "plain µs");
    }

    #[test]
    fn clock_time_is_the_time_of_day_in_utc() {
        assert_eq!(clock_time(1_700_000_000_000), "22:13:20 UTC");
        assert_eq!(micros(1_234), "1.23 ms");
        assert_eq!(micros(250), "250 µs");
    }
}
