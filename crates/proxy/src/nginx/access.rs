//! `allow` / `deny` as `ngx_http_access_handler` (1.22) applies them, in
//! the access phase (after `return`, which runs in the rewrite phase, and
//! after the real IP is set): the first rule that holds the client
//! decides; none holding allows. A client on an IPv4-mapped IPv6 address
//! is checked against the IPv4 rules when there are any.

use std::net::IpAddr;

use vigil_core::config::{AccessRule, Cidr};

/// Whether `ip` may pass `rules` (false: 403).
pub(crate) fn allows(rules: &[AccessRule], ip: IpAddr) -> bool {
    if rules.is_empty() {
        return true;
    }
    let v4_rules = rules.iter().any(|r| match r.net {
        Cidr::All => true,
        Cidr::Net { addr, .. } => addr.is_ipv4(),
        Cidr::Unix => false,
    });
    let ip = match ip {
        IpAddr::V6(v) if v4_rules => v.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        _ => ip,
    };
    rules
        .iter()
        .find(|r| r.net.contains(ip))
        .is_none_or(|r| r.allow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &[(&str, &str)]) -> Vec<AccessRule> {
        text.iter()
            .map(|(what, net)| AccessRule {
                allow: *what == "allow",
                net: match *net {
                    "all" => Cidr::All,
                    n => Cidr::parse(n).expect("cidr"),
                },
            })
            .collect()
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let r = rules(&[
            ("deny", "192.168.1.1"),
            ("allow", "192.168.1.0/24"),
            ("allow", "10.1.1.0/16"),
            ("allow", "2001:db8::/32"),
            ("deny", "all"),
        ]);
        let ok = |ip: &str| allows(&r, ip.parse().expect("ip"));
        assert!(!ok("192.168.1.1"));
        assert!(ok("192.168.1.2"));
        assert!(ok("10.1.200.3"), "10.1.1.0/16 is 10.1.0.0/16");
        assert!(ok("2001:db8::5"));
        assert!(!ok("2001:db9::5"));
        assert!(!ok("8.8.8.8"));
        assert!(ok("::ffff:192.168.1.2"), "mapped: checked as IPv4");
        assert!(!ok("::ffff:192.168.1.1"));
        assert!(allows(&[], "1.2.3.4".parse().expect("ip")));
        let only6 = rules(&[("deny", "::ffff:0:0/96")]);
        assert!(!allows(&only6, "::ffff:1.2.3.4".parse().expect("ip")));
        let v4_no_match = rules(&[("deny", "1.1.1.1")]);
        assert!(allows(&v4_no_match, "2001:db8::1".parse().expect("ip")));
    }
}
