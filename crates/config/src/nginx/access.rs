//! `allow` / `deny` (`ngx_http_access_module`) and `set_real_ip_from` /
//! `real_ip_header` / `real_ip_recursive` (`ngx_http_realip_module`),
//! parsed as nginx 1.22 parses them.

use super::syntax::Directive;
use super::{on_off, one};
use crate::ConfigError;
use vigil_core::config::{AccessRule, Cidr, ProxySettings, RealIpHeader};

/// Which of this level's lists are its own (a first directive replaces
/// the inherited list, the next ones add to it).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Own {
    rules: bool,
    from: bool,
}

/// Apply one access or realip directive; false if it is not one.
pub(super) fn directive(
    p: &mut ProxySettings,
    own: &mut Own,
    d: &Directive,
) -> Result<bool, ConfigError> {
    match d.name.as_str() {
        "allow" | "deny" => {
            let a = one(d)?;
            let net = match a.value.as_str() {
                "all" => Cidr::All,
                "unix:" => Cidr::Unix,
                v => Cidr::parse(v).ok_or_else(|| {
                    ConfigError::invalid(&a.span, format!("invalid parameter \"{v}\""))
                })?,
            };
            if !std::mem::replace(&mut own.rules, true) {
                p.access.clear();
            }
            p.access.push(AccessRule {
                allow: d.name == "allow",
                net,
            });
        }
        "set_real_ip_from" => {
            let a = one(d)?;
            let net = match a.value.as_str() {
                "unix:" => Cidr::Unix,
                v => Cidr::parse(v).ok_or_else(|| {
                    ConfigError::invalid(
                        &a.span,
                        format!(
                            "set_real_ip_from \"{v}\": vigil takes an address or CIDR network here, not a host name"
                        ),
                    )
                })?,
            };
            if !std::mem::replace(&mut own.from, true) {
                p.real_ip.from.clear();
            }
            p.real_ip.from.push(net);
        }
        "real_ip_header" => {
            let a = one(d)?;
            // nginx compares the two names case-sensitively.
            p.real_ip.header = match a.value.as_str() {
                "X-Real-IP" => RealIpHeader::XRealIp,
                "X-Forwarded-For" => RealIpHeader::XForwardedFor,
                "proxy_protocol" => {
                    return Err(ConfigError::invalid(
                        &a.span,
                        "real_ip_header proxy_protocol is not supported: vigil's listeners do not take the PROXY protocol",
                    ))
                }
                v => RealIpHeader::Other(v.to_ascii_lowercase()),
            };
        }
        "real_ip_recursive" => p.real_ip.recursive = on_off(d)?,
        _ => return Ok(false),
    }
    Ok(true)
}
