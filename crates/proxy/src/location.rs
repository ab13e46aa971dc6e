//! The locations of one `server {}` block, matched as nginx's static
//! location tree (`ngx_http_core_find_static_location`) matches them, on
//! the normalised URI: `= exact` first, then the longest prefix; and when
//! only `/api/` (with `proxy_pass`) would fit `/api`, nginx's
//! `auto_redirect`: a 301 to the location with its slash.

use std::collections::HashMap;

use vigil_core::config::{Location, LocationMatch};

/// One server block's locations, ready to match.
#[derive(Debug, Default)]
pub(crate) struct Locations {
    /// Location paths, in config order (the index is the location's).
    paths: Vec<String>,
    exact: HashMap<Vec<u8>, usize>,
    /// Prefix (and `^~`) locations, longest path first.
    prefixes: Vec<usize>,
    /// `auto_redirect` locations (a `proxy_pass` and a path ending in `/`)
    /// by their path without the slash; an exact one before a prefix one.
    redirects: HashMap<Vec<u8>, usize>,
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
}

// === impl Locations ===

impl Locations {
    /// Index `locations` (config order); an error names a duplicate.
    pub(crate) fn build(locations: &[Location]) -> Result<Self, String> {
        let mut out = Self::default();
        let mut inclusive: HashMap<&str, ()> = HashMap::new();
        for (i, loc) in locations.iter().enumerate() {
            out.paths.push(loc.path.clone());
            let duplicate = match loc.matcher {
                LocationMatch::Exact => out.exact.insert(loc.path.as_bytes().to_vec(), i).is_some(),
                LocationMatch::Prefix | LocationMatch::PrefixNoRegex => {
                    out.prefixes.push(i);
                    inclusive.insert(&loc.path, ()).is_some()
                }
            };
            if duplicate {
                return Err(format!("duplicate location \"{}\"", loc.path));
            }
        }
        // Stable: equal lengths keep config order (they cannot both match).
        out.prefixes
            .sort_by_key(|&i| std::cmp::Reverse(locations[i].path.len()));
        let redirecting = |l: &Location| l.proxy.pass.is_some() && l.path.ends_with('/');
        for exact_first in [true, false] {
            for (i, l) in locations.iter().enumerate() {
                if (l.matcher == LocationMatch::Exact) == exact_first && redirecting(l) {
                    let bare = &l.path.as_bytes()[..l.path.len() - 1];
                    out.redirects.entry(bare.to_vec()).or_insert(i);
                }
            }
        }
        Ok(out)
    }

    /// The location for the normalised URI `uri`.
    pub(crate) fn find(&self, uri: &[u8]) -> Found {
        if let Some(&i) = self.exact.get(uri) {
            return Found::Location(i);
        }
        let longest = self
            .prefixes
            .iter()
            .copied()
            .find(|&i| uri.starts_with(self.paths[i].as_bytes()));
        match longest {
            // A prefix location named exactly so is found before any redirect.
            Some(i) if self.paths[i].len() == uri.len() => Found::Location(i),
            _ => match self.redirects.get(uri) {
                Some(&i) => Found::Redirect(i),
                None => longest.map_or(Found::Nothing, Found::Location),
            },
        }
    }

    /// The path of location `i`.
    pub(crate) fn path(&self, i: usize) -> &str {
        self.paths.get(i).map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_core::config::ProxyPass;

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
    }
}
