//! nginx's wall-clock variables: `$time_local`
//! (`01/Dec/2026:07:12:58 +0000`, the access log's `combined` format),
//! `$time_iso8601` (`2026-12-01T07:12:58+00:00`) and `$msec`
//! (`1796109178.123`). The first two are in the local time zone, as
//! nginx's `ngx_localtime` gives them: `TZ` when it is set (a zone name,
//! `:name`, a file path or a POSIX rule, as glibc reads it), else
//! `/etc/localtime`, else UTC. The zone is read once per process (nginx
//! reads it at start) by jiff, which parses the TZ database itself: no
//! libc `localtime` call, so it is safe in a multi-threaded process.

use std::fmt::{self, Write};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;

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

/// The process's local time zone (UTC where none can be read).
fn local_zone() -> &'static TimeZone {
    static ZONE: OnceLock<TimeZone> = OnceLock::new();
    ZONE.get_or_init(|| {
        TimeZone::try_system().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the local time zone; times are in UTC");
            TimeZone::UTC
        })
    })
}

/// Write `at` as `what` in the local time zone (a time before 1970 is
/// written as the epoch).
pub(crate) fn write(out: &mut impl Write, what: Wall, at: SystemTime) -> fmt::Result {
    write_in(out, what, at, local_zone())
}

/// Write `at` as nginx's error log writes its time, in the local time
/// zone: `2026/12/07 23:10:00`.
pub fn write_error_log_time(out: &mut impl Write, at: SystemTime) -> fmt::Result {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ts = i64::try_from(since.as_secs())
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let t = local_zone().to_offset(ts).to_datetime(ts);
    write!(
        out,
        "{:04}/{:02}/{:02} {:02}:{:02}:{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Write `at` as `what` in `zone`.
fn write_in(out: &mut impl Write, what: Wall, at: SystemTime, zone: &TimeZone) -> fmt::Result {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    if what == Wall::Msec {
        return write!(out, "{}.{:03}", since.as_secs(), since.subsec_millis());
    }
    let ts = i64::try_from(since.as_secs())
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let offset = zone.to_offset(ts);
    let t = offset.to_datetime(ts);
    let (y, mo, d) = (t.year(), t.month(), t.day());
    let (h, mi, s) = (t.hour(), t.minute(), t.second());
    let (sign, oh, om) = parts(offset);
    match what {
        Wall::Local => {
            let name = MONTHS[usize::try_from(mo - 1).unwrap_or(0) % 12];
            write!(
                out,
                "{d:02}/{name}/{y:04}:{h:02}:{mi:02}:{s:02} {sign}{oh:02}{om:02}"
            )
        }
        _ => write!(
            out,
            "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{sign}{oh:02}:{om:02}"
        ),
    }
}

/// An offset as nginx prints it: the sign, hours and minutes (seconds
/// of an offset are dropped, as `tm_gmtoff / 60` drops them).
fn parts(offset: Offset) -> (char, i32, i32) {
    let minutes = offset.seconds() / 60;
    let sign = if minutes < 0 { '-' } else { '+' };
    let m = minutes.abs();
    (sign, m / 60, m % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64, ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms)
    }

    fn text_in(what: Wall, t: SystemTime, zone: &TimeZone) -> String {
        let mut s = String::new();
        write_in(&mut s, what, t, zone).expect("write");
        s
    }

    fn text(what: Wall, t: SystemTime) -> String {
        text_in(what, t, &TimeZone::UTC)
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

    #[test]
    fn zones_east_west_and_half_hours() {
        let t = at(1_796_109_178, 0);
        let posix = |rule: &str| TimeZone::posix(rule).expect(rule);
        // POSIX rules count west as positive: CST-8 is UTC+8.
        assert_eq!(
            text_in(Wall::Local, t, &posix("CST-8")),
            "01/Dec/2026:15:12:58 +0800"
        );
        assert_eq!(
            text_in(Wall::Iso8601, t, &posix("EST5")),
            "2026-12-01T02:12:58-05:00"
        );
        assert_eq!(
            text_in(Wall::Local, t, &posix("IST-5:30")),
            "01/Dec/2026:12:42:58 +0530"
        );
        // Across midnight and a month: 31 Dec 23:30 UTC is 1 Jan in UTC+8.
        assert_eq!(
            text_in(Wall::Local, at(1_798_759_800, 0), &posix("CST-8")),
            "01/Jan/2027:07:30:00 +0800"
        );
    }
}
