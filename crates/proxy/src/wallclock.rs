//! nginx's wall-clock variables, in UTC: `$time_local`
//! (`01/Dec/2026:07:12:58 +0000`, the access log's `combined` format),
//! `$time_iso8601` (`2026-12-01T07:12:58+00:00`) and `$msec`
//! (`1796109178.123`). nginx prints the server's local time zone in the
//! first two; vigil always prints UTC (docs/configuration.md).

use std::fmt::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;

/// Which of the three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wall {
    /// `$time_local`.
    Local,
    /// `$time_iso8601`.
    Iso8601,
    /// `$msec`: seconds with milliseconds.
    Msec,
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Write `at` as `what` (a time before 1970 is written as the epoch).
pub(crate) fn write(out: &mut impl Write, what: Wall, at: SystemTime) -> fmt::Result {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    if what == Wall::Msec {
        return write!(out, "{}.{:03}", since.as_secs(), since.subsec_millis());
    }
    let t = i64::try_from(since.as_secs())
        .ok()
        .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let (y, d, h, mi, s) = (t.year(), t.day(), t.hour(), t.minute(), t.second());
    let mo = u8::from(t.month());
    match what {
        Wall::Local => {
            let name = MONTHS[usize::from(mo - 1) % 12];
            write!(out, "{d:02}/{name}/{y:04}:{h:02}:{mi:02}:{s:02} +0000")
        }
        _ => write!(out, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}+00:00"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64, ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms)
    }

    fn text(what: Wall, t: SystemTime) -> String {
        let mut s = String::new();
        write(&mut s, what, t).expect("write");
        s
    }

    #[test]
    fn the_three_forms_across_years() {
        let t = at(1_796_109_178, 123);
        assert_eq!(text(Wall::Local, t), "01/Dec/2026:07:12:58 +0000");
        assert_eq!(text(Wall::Iso8601, t), "2026-12-01T07:12:58+00:00");
        assert_eq!(text(Wall::Msec, t), "1796109178.123");
        assert_eq!(
            text(Wall::Local, at(951_782_400, 0)),
            "29/Feb/2000:00:00:00 +0000"
        );
        assert_eq!(text(Wall::Iso8601, at(0, 0)), "1970-01-01T00:00:00+00:00");
    }
}
