//! Parsers for the value syntaxes both front ends share: nginx's time
//! (`500ms`, `10s`, `1m30s`; a bare number is seconds) and size (`1m`,
//! `512k`; a bare number is bytes) notations.

use std::time::Duration;

/// A value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not a time.
    #[error("invalid time \"{0}\", expected a number with a unit ms, s, m, h, d, w, M or y (e.g. 500ms, 10s, 1m30s)")]
    Time(String),
    /// Not a size.
    #[error("invalid size \"{0}\", expected bytes with an optional k or m unit (e.g. 512k, 1m)")]
    Size(String),
}

/// Parse nginx's time notation (`ngx_parse_time`): terms like `1h30m`,
/// units ms s m h d w M y, a bare number means seconds. Milliseconds are
/// kept (nginx rounds some settings to seconds; vigil does not).
pub fn parse_time(s: &str) -> Result<Duration, ValueError> {
    let err = || ValueError::Time(s.to_string());
    if s.is_empty() {
        return Err(err());
    }
    let bytes = s.as_bytes();
    let mut total: u64 = 0;
    let mut i = 0;
    let mut last_unit_rank = u8::MAX;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(err());
        }
        let n: u64 = s[start..i].parse().map_err(|_| err())?;
        let (ms_per, rank, len) = match &bytes[i..] {
            [b'm', b's', ..] => (1, 0, 2),
            [b's', ..] => (1_000, 1, 1),
            [b'm', ..] => (60_000, 2, 1),
            [b'h', ..] => (3_600_000, 3, 1),
            [b'd', ..] => (86_400_000, 4, 1),
            [b'w', ..] => (604_800_000, 5, 1),
            [b'M', ..] => (2_592_000_000, 6, 1),
            [b'y', ..] => (31_536_000_000, 7, 1),
            [] => (1_000, 1, 0),
            _ => return Err(err()),
        };
        // nginx requires units in decreasing order and each at most once.
        if rank >= last_unit_rank {
            return Err(err());
        }
        last_unit_rank = rank;
        i += len;
        total = n
            .checked_mul(ms_per)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(err)?;
    }
    Ok(Duration::from_millis(total))
}

/// Parse nginx's size notation (`ngx_parse_size`): `N`, `Nk`, `Nm`, `Ng`.
pub fn parse_size(s: &str) -> Result<u64, ValueError> {
    let err = || ValueError::Size(s.to_string());
    let (num, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1024),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1024 * 1024),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(err)
}

/// Format a duration the way nginx.conf and vigil's TOML write it
/// (`10s`, `500ms`, `1m30s`).
pub fn format_time(d: Duration) -> String {
    let mut ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    for (unit, per) in [("h", 3_600_000u64), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= per {
            out.push_str(&format!("{}{unit}", ms / per));
            ms %= per;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_time("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_time("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_time("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_time("").is_err());
        assert!(parse_time("s").is_err());
        assert!(parse_time("10x").is_err());
        assert!(parse_time("1s1m").is_err());
        assert!(parse_time("-1s").is_err());
        assert!(parse_time("99999999999999999999y").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("1t").is_err());
        assert!(parse_size("k").is_err());
    }

    proptest! {
        #[test]
        fn format_parses_back(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_time(&format_time(d)), Ok(d));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,12}") {
            let _ = parse_time(&s);
            let _ = parse_size(&s);
        }
    }
}
