//! The locations of one `server {}` block, matched as nginx's
//! `ngx_http_core_find_location` matches them on the normalised URI: `=
//! exact` first, then the longest prefix (and, recursively, the locations
//! nested in it); unless that prefix is `^~`, the regex locations of the
//! level in file order (the first match wins, then its nested ones); else
//! the longest prefix. When only `/api/` (with `proxy_pass`) would fit
//! `/api`, nginx's `auto_redirect`: a 301 to the location with its slash.
//! Named locations (`@name`) are found by name only.

use std::collections::HashMap;

use vigil_config::pattern::Regex;
use vigil_core::config::{Location, LocationMatch};

/// One server block's locations, ready to match.
#[derive(Debug, Default)]
pub(crate) struct Locations {
    /// Location paths, in config order (the index is the location's).
    paths: Vec<String>,
    /// `^~`, by location.
    noregex: Vec<bool>,
    /// The compiled expression of a regex location, by location.
    regexes: Vec<Option<Regex>>,
    /// The server level.
    top: Level,
    /// The locations nested in each location, by location.
    nested: Vec<Level>,
    /// `@name` locations.
    named: HashMap<String, usize>,
}

/// The locations of one level (the server's, or those nested in one location).
#[derive(Debug, Default)]
struct Level {
    exact: Paths,
    /// Prefix (and `^~`) locations, longest path first.
    prefixes: Vec<usize>,
    /// Regex locations, in file order.
    regexes: Vec<usize>,
    /// `auto_redirect` locations (a `proxy_pass` and a path ending in `/`)
    /// by their path without the slash; an exact one before a prefix one.
    redirects: Paths,
}

/// Paths to locations, looked up for every request: a URI no key has the
/// length of (most of them) is told apart without hashing it.
#[derive(Debug, Default)]
struct Paths {
    map: HashMap<Vec<u8>, usize>,
    /// Bit `n`: a key of `n` bytes (bit 63: of 63 or more).
    lengths: u64,
}

/// Which location a URI gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The location with this index.
    Location(usize),
    /// 301 to this location's path (the URI lacked its final `/`).
    Redirect(usize),
    /// No location matches.
    Nothing,
    /// A regex could not finish its match (PCRE's match limit): nginx's
    /// find-config phase fails with 500.
    Failed,
}

/// nginx's return codes of the search.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rc {
    /// An exact or regex match: final.
    Ok,
    /// auto_redirect: final.
    Done,
    /// A prefix matched (regexes may still win).
    Again,
    /// Nothing at this level.
    Declined,
    /// A regex failed (`NGX_ERROR`): final.
    Error,
}

/// The groups of the regex that matched: group 0 first.
pub(crate) type Captures = vigil_config::pattern::Groups;

// === impl Locations ===

impl Locations {
    /// Index `locations` (config order, each knowing its parent); an error
    /// names a duplicate or an expression that does not compile.
    pub(crate) fn build(locations: &[Location]) -> Result<Self, String> {
        let mut out = Self {
            nested: locations.iter().map(|_| Level::default()).collect(),
            ..Self::default()
        };
        let mut inclusive: HashMap<(Option<usize>, &str), ()> = HashMap::new();
        for (i, loc) in locations.iter().enumerate() {
            out.paths.push(loc.path.clone());
            out.noregex
                .push(loc.matcher == LocationMatch::PrefixNoRegex);
            out.regexes.push(match loc.matcher {
                LocationMatch::Regex | LocationMatch::RegexCaseless => {
                    Some(vigil_config::pattern::compile(
                        &loc.path,
                        loc.matcher == LocationMatch::RegexCaseless,
                    )?)
                }
                _ => None,
            });
            let parent = loc.routing.parent.filter(|p| *p < i);
            let level = match parent {
                Some(p) => &mut out.nested[p],
                None => &mut out.top,
            };
            let duplicate = match loc.matcher {
                LocationMatch::Exact => level.exact.insert(loc.path.as_bytes().to_vec(), i),
                LocationMatch::Prefix | LocationMatch::PrefixNoRegex => {
                    level.prefixes.push(i);
                    inclusive.insert((parent, &loc.path), ()).is_some()
                }
                LocationMatch::Regex | LocationMatch::RegexCaseless => {
                    level.regexes.push(i);
                    false
                }
                LocationMatch::Named => out.named.insert(loc.path.clone(), i).is_some(),
            };
            if duplicate {
                return Err(format!("duplicate location \"{}\"", loc.path));
            }
        }
        let redirecting = |l: &Location| {
            l.proxy.pass.is_some()
                && l.path.ends_with('/')
                && matches!(
                    l.matcher,
                    LocationMatch::Exact | LocationMatch::Prefix | LocationMatch::PrefixNoRegex
                )
        };
        for level in std::iter::once(&mut out.top).chain(out.nested.iter_mut()) {
            // Stable: equal lengths keep config order (they cannot both match).
            level
                .prefixes
                .sort_by_key(|&i| std::cmp::Reverse(locations[i].path.len()));
            let members: Vec<usize> = level
                .exact
                .map
                .values()
                .chain(level.prefixes.iter())
                .copied()
                .collect();
            for exact_first in [true, false] {
                let mut ms: Vec<usize> = members.clone();
                ms.sort_unstable();
                for i in ms {
                    let l = &locations[i];
                    if (l.matcher == LocationMatch::Exact) == exact_first && redirecting(l) {
                        let bare = &l.path.as_bytes()[..l.path.len() - 1];
                        level.redirects.keep_first(bare.to_vec(), i);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The location for the normalised URI `uri`.
    #[cfg(test)]
    pub(crate) fn find(&self, uri: &[u8]) -> Found {
        self.search(uri).0
    }

    /// The location for the normalised URI `uri`, and the groups of the
    /// regex location that matched.
    pub(crate) fn search(&self, uri: &[u8]) -> (Found, Option<Captures>) {
        let mut caps = None;
        let (rc, at) = self.find_in(&self.top, uri, &mut caps, 0);
        let found = match (rc, at) {
            (Rc::Error, _) => Found::Failed,
            (Rc::Done, Some(i)) => Found::Redirect(i),
            (_, Some(i)) => Found::Location(i),
            (_, None) => Found::Nothing,
        };
        (found, caps)
    }

    /// `ngx_http_core_find_location` on one level: what it returns and
    /// where `r->loc_conf` points after it (None: not moved).
    fn find_in(
        &self,
        level: &Level,
        uri: &[u8],
        caps: &mut Option<Captures>,
        depth: usize,
    ) -> (Rc, Option<usize>) {
        // Nesting follows the configuration's blocks (at most 64 deep).
        if depth > 64 {
            return (Rc::Declined, None);
        }
        let mut at = None;
        let mut noregex = false;
        let mut rc = match level.find_static(&self.paths, uri) {
            (Rc::Again, Some(i)) => {
                at = Some(i);
                noregex = self.noregex.get(i).copied().unwrap_or(false);
                let (nrc, nat) = self.find_in(&self.nested[i], uri, caps, depth + 1);
                if nat.is_some() {
                    at = nat;
                }
                nrc
            }
            (rc, i) => {
                at = i.or(at);
                rc
            }
        };
        if matches!(rc, Rc::Ok | Rc::Done | Rc::Error) {
            return (rc, at);
        }
        if !noregex {
            for &i in &level.regexes {
                let Some(Some(re)) = self.regexes.get(i) else {
                    continue;
                };
                match re.captures(uri) {
                    Ok(Some(groups)) => {
                        *caps = Some(groups);
                        let (nrc, nat) = self.find_in(&self.nested[i], uri, caps, depth + 1);
                        if nrc == Rc::Error {
                            return (Rc::Error, None);
                        }
                        return (Rc::Ok, nat.or(Some(i)));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // nginx logs it at "alert" and answers 500.
                        tracing::error!(uri = %String::from_utf8_lossy(uri), "{e}");
                        return (Rc::Error, None);
                    }
                }
            }
        }
        if rc == Rc::Declined && at.is_some() {
            rc = Rc::Again;
        }
        (rc, at)
    }

    /// The `@name` location (`error_page`).
    pub(crate) fn named(&self, name: &str) -> Option<usize> {
        self.named.get(name).copied()
    }

    /// The path of location `i`.
    pub(crate) fn path(&self, i: usize) -> &str {
        self.paths.get(i).map_or("", String::as_str)
    }

    /// The named groups of every regex location (they are variables).
    pub(crate) fn group_names(&self) -> impl Iterator<Item = &str> {
        self.regexes
            .iter()
            .flatten()
            .flat_map(vigil_config::pattern::group_names)
    }
}

// === impl Level ===

impl Level {
    /// `ngx_http_core_find_static_location`: exact, else the longest
    /// prefix, with the auto_redirect of a prefix one `/` longer.
    fn find_static(&self, paths: &[String], uri: &[u8]) -> (Rc, Option<usize>) {
        if let Some(i) = self.exact.get(uri) {
            return (Rc::Ok, Some(i));
        }
        let longest = self
            .prefixes
            .iter()
            .copied()
            .find(|&i| uri.starts_with(paths[i].as_bytes()));
        match longest {
            // A prefix location named exactly so is found before any redirect.
            Some(i) if paths[i].len() == uri.len() => (Rc::Again, Some(i)),
            _ => match self.redirects.get(uri) {
                Some(i) => (Rc::Done, Some(i)),
                None => match longest {
                    Some(i) => (Rc::Again, Some(i)),
                    None => (Rc::Declined, None),
                },
            },
        }
    }
}

// === impl Paths ===

impl Paths {
    fn bit(len: usize) -> u64 {
        1 << len.min(63)
    }

    /// Map `key` to `i`; whether it was there already.
    fn insert(&mut self, key: Vec<u8>, i: usize) -> bool {
        self.lengths |= Self::bit(key.len());
        self.map.insert(key, i).is_some()
    }

    /// Map `key` to `i` unless it has a location already.
    fn keep_first(&mut self, key: Vec<u8>, i: usize) {
        self.lengths |= Self::bit(key.len());
        self.map.entry(key).or_insert(i);
    }

    fn get(&self, uri: &[u8]) -> Option<usize> {
        if self.lengths & Self::bit(uri.len()) == 0 {
            return None;
        }
        self.map.get(uri).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_core::config::ProxyPass;

    #[test]
    fn paths_find_their_keys_of_every_length_and_nothing_else() {
        let long = vec![b'a'; 100];
        let mut p = Paths::default();
        assert_eq!(p.get(b""), None);
        assert!(!p.insert(b"".to_vec(), 0));
        assert!(!p.insert(b"/api".to_vec(), 1));
        assert!(!p.insert(long.clone(), 2));
        p.keep_first(b"/api".to_vec(), 9);
        assert!(p.insert(b"/api".to_vec(), 1), "there already");
        assert_eq!(p.get(b""), Some(0));
        assert_eq!(p.get(b"/api"), Some(1));
        assert_eq!(p.get(&long), Some(2));
        assert_eq!(p.get(b"/apx"), None, "a key's length, not its bytes");
        assert_eq!(p.get(b"/ap"), None);
        assert_eq!(p.get(&long[..99]), None, "another long length");
    }

    fn loc(spec: &str, pass: bool) -> Location {
        let (matcher, path) = match spec.strip_prefix("= ") {
            Some(p) => (LocationMatch::Exact, p),
            None => (LocationMatch::Prefix, spec),
        };
        let mut l = Location {
            matcher,
            path: path.to_string(),
            proxy: Default::default(),
            ret: None,
            routing: Default::default(),
            origin: Default::default(),
        };
        if pass {
            l.proxy.pass = Some(ProxyPass {
                tls: false,
                upstream: "u".into(),
                uri: None,
            });
        }
        l
    }

    #[test]
    fn exact_then_longest_prefix_then_redirect() {
        let ls = [
            loc("/", true),
            loc("/api/", true),
            loc("= /api/x", true),
            loc("/api/long/", true),
            loc("= /exact/", true),
            loc("/plain/", false),
            loc("/both", true),
            loc("/both/", true),
        ];
        let t = Locations::build(&ls).expect("build");
        let f = |u: &str| match t.find(u.as_bytes()) {
            Found::Location(i) => ls[i].path.clone(),
            Found::Redirect(i) => format!("301 {}", ls[i].path),
            Found::Nothing => "none".into(),
            Found::Failed => "500".into(),
        };
        assert_eq!(f("/"), "/");
        assert_eq!(f("/api/y"), "/api/");
        assert_eq!(f("/api/x"), "/api/x");
        assert_eq!(f("/api/long/z"), "/api/long/");
        // Each seen on stock nginx: /api and /exact answer 301.
        assert_eq!(f("/api"), "301 /api/");
        assert_eq!(f("/exact"), "301 /exact/");
        assert_eq!(f("/api/long"), "301 /api/long/");
        assert_eq!(f("/plain"), "/", "no proxy_pass, no auto_redirect");
        assert_eq!(
            f("/both"),
            "/both",
            "a location named so wins over the redirect"
        );
        assert_eq!(f("/ap"), "/");
    }

    #[test]
    fn no_location_is_nothing_and_duplicates_are_refused() {
        let t = Locations::build(&[loc("/api/", true)]).expect("build");
        assert_eq!(t.find(b"/secret/flag.txt"), Found::Nothing);
        assert_eq!(t.find(b"/api"), Found::Redirect(0));
        assert!(Locations::build(&[loc("/a", true), loc("/a", false)]).is_err());
        assert!(Locations::build(&[loc("= /a", true), loc("/a", false)]).is_ok());
        let mut named = loc("@x", false);
        named.matcher = LocationMatch::Named;
        let t = Locations::build(&[loc("/", false), named]).expect("build");
        assert_eq!(t.named("@x"), Some(1));
        assert_eq!(t.find(b"/@x"), Found::Location(0), "found by name only");
    }

    #[test]
    fn regexes_read_as_pcre_and_a_failed_one_is_final() {
        let re = |path: &str| {
            let mut l = loc(path, false);
            l.matcher = LocationMatch::Regex;
            l
        };
        let ls = [
            loc("/", true),
            re("^/adm2$"),
            re("^/(a|aa)+$"),
            re("^/api/(?<v>v\\d+)/"),
        ];
        let t = Locations::build(&ls).expect("build");
        assert_eq!(t.find(b"/adm2"), Found::Location(1));
        assert_eq!(
            t.find(b"/adm2\n"),
            Found::Location(1),
            "`$` matches before a final newline (/adm2%0a)"
        );
        assert_eq!(t.find(b"/adm2\n\n"), Found::Location(0));
        assert_eq!(t.find(b"/aaa"), Found::Location(2));
        // PCRE's match limit: 500, never the prefix location.
        let runaway = format!("/{}b", "a".repeat(40));
        assert_eq!(t.find(runaway.as_bytes()), Found::Failed);
        let (found, caps) = t.search(b"/api/v2/x");
        assert_eq!(found, Found::Location(3));
        assert_eq!(caps, Some(vec![Some("/api/v2/".into()), Some("v2".into())]));
    }
}
