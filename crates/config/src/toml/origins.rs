//! Source positions for the model ([`Origin`]), so that lint findings on a
//! TOML configuration point into the file as they do for nginx.conf: an
//! upstream at its name, a server line at its `[[...server]]` header (or
//! inline table), `keepalive` and `check` at their keys, servers and
//! locations at their headers, an implicit upstream at its `proxy_pass`.

use std::ops::Range;
use std::path::Path;

use ::toml::de::{DeString, DeTable, DeValue};
use ::toml::Spanned;

use super::errpath::line_col;
use vigil_core::config::{Config, Origin};

/// Set the origins of `config`, built from `src`, to their places in `file`.
pub(super) fn fill(config: &mut Config, src: &str, file: &Path) {
    let Ok(doc) = DeTable::parse(src) else {
        return;
    };
    let at = |span: Range<usize>| {
        let (line, col) = line_col(src, span.start);
        Origin::at(
            file.to_path_buf(),
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(col).unwrap_or(u32::MAX),
        )
    };
    let upstreams = entry(doc.get_ref(), "upstream").and_then(|(_, v)| v.get_ref().as_table());
    for up in &mut config.upstreams {
        let Some((key, value)) = upstreams.and_then(|t| entry(t, &up.name)) else {
            continue;
        };
        up.origin = at(key.span());
        let Some(t) = value.get_ref().as_table() else {
            continue;
        };
        if let Some((_, list)) = entry(t, "server") {
            for (s, v) in up.servers.iter_mut().zip(elements(list)) {
                s.origin = at(v.span());
            }
        }
        if let (Some(k), Some((key, _))) = (&mut up.keepalive, entry(t, "keepalive")) {
            k.origin = at(key.span());
        }
        if let (Some(c), Some((key, _))) = (&mut up.check, entry(t, "check")) {
            c.origin = at(key.span());
        }
        let o = &mut up.rules.origins;
        for (name, slot) in [
            ("passive_count", &mut o.count),
            ("passive_recovery", &mut o.recovery),
            ("passive_penalty", &mut o.penalty),
            ("retry_budget", &mut o.retry_budget),
            ("hedge", &mut o.hedge),
            ("max_ejected", &mut o.max_ejected),
            ("eject_stuck", &mut o.eject_stuck),
            ("eject_slow", &mut o.eject_slow),
            ("health_preset", &mut o.preset),
        ] {
            if let Some((key, _)) = entry(t, name) {
                *slot = at(key.span());
            }
        }
        // What the preset supplied is found at the preset's key.
        if let (Some(p), Some((key, _))) = (up.rules.preset, entry(t, "health_preset")) {
            let o = &mut up.rules.origins;
            let s = p.supplied;
            for (on, slot) in [
                (s.passive_count, &mut o.count),
                (s.passive_recovery, &mut o.recovery),
                (s.passive_penalty, &mut o.penalty),
                (s.max_ejected, &mut o.max_ejected),
                (s.eject_stuck, &mut o.eject_stuck),
                (s.eject_slow, &mut o.eject_slow),
            ] {
                if on {
                    *slot = at(key.span());
                }
            }
        }
    }
    let Some((_, servers)) = entry(doc.get_ref(), "server") else {
        return;
    };
    for (server, sv) in config.servers.iter_mut().zip(elements(servers)) {
        server.origin = at(sv.span());
        let Some((_, locations)) = sv.get_ref().as_table().and_then(|t| entry(t, "location"))
        else {
            continue;
        };
        for (loc, lv) in server.locations.iter_mut().zip(elements(locations)) {
            loc.origin = at(lv.span());
            let Some(pass) = &loc.proxy.pass else {
                continue;
            };
            let implicit = upstreams.and_then(|t| entry(t, &pass.upstream)).is_none();
            let key = lv.get_ref().as_table().and_then(|t| entry(t, "proxy_pass"));
            let up = config
                .upstreams
                .iter_mut()
                .find(|u| u.name == pass.upstream);
            if let (true, Some((key, _)), Some(up)) = (implicit, key, up) {
                if up.origin.0.is_none() {
                    up.origin = at(key.span());
                    for s in &mut up.servers {
                        s.origin = up.origin.clone();
                    }
                }
            }
        }
    }
}

type Entry<'a, 'i> = (&'a Spanned<DeString<'i>>, &'a Spanned<DeValue<'i>>);

fn entry<'a, 'i>(t: &'a DeTable<'i>, key: &str) -> Option<Entry<'a, 'i>> {
    t.iter().find(|(k, _)| k.get_ref() == key)
}

/// The elements of an array value (none if it is not one).
fn elements<'a, 'i>(v: &'a Spanned<DeValue<'i>>) -> impl Iterator<Item = &'a Spanned<DeValue<'i>>> {
    v.get_ref().as_array().into_iter().flat_map(|a| a.iter())
}
