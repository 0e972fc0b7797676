//! Which addresses a webhook may be posted to, and the DNS resolver that
//! enforces it on the addresses actually connected to.
//!
//! A member declares webhook URLs; without this rule the head would post to
//! (and report how it went from) its own loopback, link-local metadata
//! services or private network. By default only public addresses are
//! allowed; the policy's `webhooks` (`xp_sched::config::WebhookPolicy`)
//! allows every address (`allow_private`) or some networks (`allow`).
//!
//! The check runs where the address is chosen: on an IP literal before any
//! connection, and in [`FilteringResolver`] for names, which reqwest calls for
//! every connection it opens, so a name that resolves to a public address when
//! declared and to a private one later (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use xp_sched::config::WebhookPolicy;

/// The allowance in force, from the policy's `webhooks`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AddressRule {
    policy: WebhookPolicy,
}

/// A webhook's address was refused by the rule; the class says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("address not allowed ({0}); the policy's `webhooks` can allow it")]
pub(crate) struct Refused(pub &'static str);

/// A webhook's host name did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve the host")]
pub(crate) struct Unresolved;

impl AddressRule {
    /// The rule a policy sets.
    pub(crate) fn new(policy: WebhookPolicy) -> Self {
        Self { policy }
    }

    /// Whether a webhook may connect to `ip`.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), Refused> {
        let Some(class) = non_public(ip) else {
            return Ok(());
        };
        let allowed = self.policy.allow_private
            || self.policy.allow.iter().any(|net| net.contains(&ip))
            // `allow: [127.0.0.0/8]` also allows `::ffff:127.0.0.1`.
            || canonical(ip) != ip && self.policy.allow.iter().any(|net| net.contains(&canonical(ip)));
        if allowed { Ok(()) } else { Err(Refused(class)) }
    }
}

/// An IPv4 address carried in an IPv6 one (mapped, or NAT64's `64:ff9b::/96`)
/// as that IPv4 address; any other address as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let segments = v6.segments();
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., a, b, c, d] = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            ip
        }
        IpAddr::V4(_) => ip,
    }
}

/// The class of a non-public address (`loopback`, `private`, ...); `None`
/// for a public one.
pub(crate) fn non_public(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        // RFC 1918, and RFC 6598's shared space (carrier NAT).
        Some("private")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
        // Unique local (fc00::/7), and the deprecated site-local fec0::/10.
        Some("private")
    } else {
        None
    }
}

/// Resolves webhook hosts with the system resolver and keeps only the
/// addresses the rule allows; with none left, the connection fails with
/// [`Refused`] before any is opened.
#[derive(Debug, Clone)]
pub(crate) struct FilteringResolver {
    rule: Arc<RwLock<AddressRule>>,
}

impl FilteringResolver {
    /// A resolver judging by the rule in `rule` when each name is resolved.
    pub(crate) fn new(rule: Arc<RwLock<AddressRule>>) -> Self {
        Self { rule }
    }
}

impl Resolve for FilteringResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let rule = self.rule.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await
                .map_err(|_| Unresolved)?
                .collect();
            let rule = rule.read().expect("no holder of this lock panics").clone();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|address| match rule.check(address.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused = Some(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                return Err(match refused {
                    Some(why) => Box::new(why) as Box<dyn std::error::Error + Send + Sync>,
                    None => Box::new(Unresolved),
                });
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_pass_by_default() {
        let rule = AddressRule::default();
        for (address, class) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("64:ff9b::7f00:1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("10.0.0.1", "private"),
            ("172.16.5.4", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("fd12:3456::1", "private"),
            ("224.0.0.1", "multicast"),
            ("ff02::1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
        ] {
            assert_eq!(rule.check(ip(address)), Err(Refused(class)), "{address}");
        }
        for public in ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "172.32.0.1"] {
            assert_eq!(rule.check(ip(public)), Ok(()), "{public}");
        }
    }

    #[test]
    fn the_policy_allows_every_address_or_some_networks() {
        let open = AddressRule::new(WebhookPolicy {
            allow_private: true,
            allow: Vec::new(),
        });
        assert_eq!(open.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(open.check(ip("fd00::1")), Ok(()));
        let some = AddressRule::new(WebhookPolicy {
            allow_private: false,
            allow: vec![
                "127.0.0.0/8".parse().unwrap(),
                "10.1.2.0/24".parse().unwrap(),
            ],
        });
        assert_eq!(some.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(some.check(ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(some.check(ip("10.1.2.200")), Ok(()));
        assert_eq!(some.check(ip("10.1.3.1")), Err(Refused("private")));
        assert_eq!(some.check(ip("::1")), Err(Refused("loopback")));
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses() {
        let strict = FilteringResolver::new(Arc::new(RwLock::new(AddressRule::default())));
        let error = strict
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .expect("localhost is refused");
        assert!(error.downcast_ref::<Refused>().is_some(), "{error}");
        let loopback = AddressRule::new(WebhookPolicy {
            allow_private: false,
            allow: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
        });
        let allowed = FilteringResolver::new(Arc::new(RwLock::new(loopback)));
        let addresses: Vec<SocketAddr> = allowed
            .resolve("localhost".parse().unwrap())
            .await
            .expect("localhost is allowed")
            .collect();
        assert!(!addresses.is_empty());
        assert!(addresses.iter().all(|address| address.ip().is_loopback()));
    }
}
