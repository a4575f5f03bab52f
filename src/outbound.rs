//! Where geodwell's own outgoing connections (webhook deliveries) may go.
//!
//! A webhook URL is chosen by whoever holds an admin key, and the service connects to it from
//! inside the operator's network: pointed at `127.0.0.1`, a cloud metadata address or a private
//! service, it would make geodwell a relay into places its users cannot reach (SSRF). So, unless
//! `server.allow_private_targets` is on, a target must be a **public** address:
//! - checked when a sink is created (the host is resolved; any non-public answer refuses it);
//! - checked again at every connection, on the addresses actually connected to: the HTTP
//!   client's resolver drops non-public answers, and an IP literal is checked before the
//!   request, so a name that re-resolves to a private address later (DNS rebinding) reaches
//!   nothing.
//!
//! Proxies from the environment are not used (a proxy would connect on our behalf, past these
//! checks), and redirects are not followed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use thiserror::Error;

/// Whether non-public targets are allowed (`server.allow_private_targets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TargetPolicy {
    /// Allow loopback, private, link-local and other non-public addresses.
    pub allow_private: bool,
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TargetError {
    /// The host is or resolves to an address that is not public.
    #[error(
        "{host} is {addr}, which is not a public address (loopback, private, link-local and the like are refused unless server.allow_private_targets is on)"
    )]
    NotPublic {
        /// The host as written.
        host: String,
        /// The offending address.
        addr: IpAddr,
    },
}

/// A TLS configuration for `mqtts://` connections (ingest and sinks): the system's root
/// certificates and the rustls provider the server uses.
pub fn mqtt_tls() -> Result<rumqttc::TlsConfiguration, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err("no system root certificates found for mqtts://".into());
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(rumqttc::TlsConfiguration::Rustls(Arc::new(config)))
}

/// `url` with its credentials shown as `***`: for answers and logs. Both the user name and the
/// password are hidden: brokers such as ThingsBoard and flespi take a token as the user name
/// (`nats://TOKEN@host`), so a user name is as secret as a password.
pub fn redact_credentials(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            if !u.username().is_empty() {
                let _ = u.set_username("***");
            }
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Why [`TargetPolicy::resolve`] found nothing to connect to.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    /// The name did not resolve.
    #[error("{0}")]
    Lookup(String),
    /// Every address it resolved to is refused.
    #[error(transparent)]
    Refused(TargetError),
}

/// Whether `ip` is an address on the public internet: not unspecified, loopback, private,
/// shared (CGNAT), link-local, multicast, broadcast, documentation, benchmarking or reserved; an
/// IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64, 6to4) is judged by it.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // Forms that carry an IPv4 address the packet ends up at are judged by it: mapped
    // (::ffff:a.b.c.d), translated (::ffff:0:a.b.c.d, RFC 2765), compatible (::a.b.c.d), the
    // well-known NAT64 prefix (64:ff9b::/96) and 6to4 (2002::/16).
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return is_public_v4(embedded(s[1], s[2]));
    }
    // Otherwise only global unicast (2000::/3) is public, less its special blocks: IETF
    // protocol assignments (2001::/23: Teredo, benchmarking, ORCHID, ...), documentation
    // (2001:db8::/32, 3fff::/20). Everything outside 2000::/3 (loopback, unique local,
    // link-local, multicast, local-use NAT64 64:ff9b:1::/48, discard-only 100::/64, ...) is not.
    let global_unicast = (s[0] & 0xe000) == 0x2000;
    global_unicast
        && !(s[0] == 0x2001 && s[1] < 0x0200)
        && !(s[0] == 0x2001 && s[1] == 0x0db8)
        && (s[0] & 0xfff0) != 0x3ff0
}

impl TargetPolicy {
    /// Checks one address of `host`.
    pub fn check_addr(&self, host: &str, addr: IpAddr) -> Result<(), TargetError> {
        if self.allow_private || is_public(addr) {
            Ok(())
        } else {
            Err(TargetError::NotPublic {
                host: host.to_string(),
                addr,
            })
        }
    }

    /// Checks a URL's host: an IP literal directly, a name by resolving it (every address it
    /// resolves to must pass). A name that does not resolve now passes: it is checked again at
    /// every connection.
    pub async fn check_url(&self, url: &reqwest::Url) -> Result<(), TargetError> {
        if self.allow_private {
            return Ok(());
        }
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_addr(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_addr(&ip.to_string(), IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                // A URL of a scheme the URL standard does not know (mqtt://, nats://) keeps an
                // address as an opaque host name.
                if let Ok(ip) = name.parse::<IpAddr>() {
                    return self.check_addr(name, ip);
                }
                let port = url.port_or_known_default().unwrap_or(80);
                let Ok(addrs) = tokio::net::lookup_host((name, port)).await else {
                    return Ok(());
                };
                for a in addrs {
                    self.check_addr(name, a.ip())?;
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Resolves `host:port` and checks every address; returns the first allowed one, so the
    /// caller connects to exactly the address that was checked (no second lookup to rebind).
    /// For connections other than HTTP (MQTT and NATS sinks), which have no resolver hook.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, ResolveError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| ResolveError::Lookup(format!("cannot resolve {host}: {e}")))?
            .collect();
        let mut refused = None;
        for a in &addrs {
            match self.check_addr(host, a.ip()) {
                Ok(()) => return Ok(*a),
                Err(e) => refused = Some(e),
            }
        }
        Err(match refused {
            Some(e) => ResolveError::Refused(e),
            None => ResolveError::Lookup(format!("{host} has no address")),
        })
    }

    /// The literal address of a URL's host, checked (names are checked by the client's resolver).
    pub fn check_literal(&self, url: &reqwest::Url) -> Result<(), TargetError> {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_addr(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_addr(&ip.to_string(), IpAddr::V6(ip)),
            _ => Ok(()),
        }
    }

    /// An HTTP client whose connections obey this policy: its resolver drops non-public
    /// addresses (a name left with none fails to resolve), no proxy, no redirects.
    pub fn http_client(&self, user_agent: &str) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(user_agent);
        if !self.allow_private {
            b = b.dns_resolver(Arc::new(PublicOnly));
        }
        b.build().unwrap_or_default()
    }
}

/// A resolver that answers only public addresses.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty()
                && let Some(a) = all.first()
            {
                metrics::counter!(crate::telemetry::OUTBOUND_REFUSED).increment(1);
                let e = TargetError::NotPublic {
                    host: host.clone(),
                    addr: a.ip(),
                };
                return Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.2.1",
            "198.18.0.1",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:0:7f00:1",
            "::ffff:0:a00:1",
            "64:ff9b:1::7f00:1",
            "64:ff9b:1::808:808",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",
            "2001:10::1",
            "3fff::1",
            "100::1",
            "5f00::1",
            "4000::1",
        ] {
            let ip: IpAddr = private.parse().unwrap();
            assert!(!is_public(ip), "{private} is not public");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "8.8.8.8",
            "::ffff:8.8.8.8",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:0:808:808",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:4860:4860::8888",
        ] {
            let ip: IpAddr = public.parse().unwrap();
            assert!(is_public(ip), "{public} is public");
        }
    }

    #[tokio::test]
    async fn urls_that_reach_inside_are_refused_unless_allowed() {
        let deny = TargetPolicy::default();
        for url in [
            "http://127.0.0.1:9/hook",
            "http://localhost:9/hook",
            "http://0.0.0.0/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://127.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let u = reqwest::Url::parse(url).unwrap();
            assert!(deny.check_url(&u).await.is_err(), "{url}");
        }
        let allow = TargetPolicy {
            allow_private: true,
        };
        let u = reqwest::Url::parse("http://127.0.0.1:9/hook").unwrap();
        assert!(allow.check_url(&u).await.is_ok());
        assert!(allow.check_literal(&u).is_ok());
        assert!(deny.check_literal(&u).is_err());
    }
}
