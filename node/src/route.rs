//! Which of this machine's addresses and network interfaces carry traffic to a
//! peer: what a node advertises to the others, and which interface a worker's
//! gloo, NCCL and TensorPipe sockets use.
//!
//! A node advertises the local address of its route to the head: the address the
//! kernel would send from to reach the head, which the head's other nodes can
//! reach too unless the network is partitioned. It is a loopback address only when
//! the head is on loopback. A host name is not used: on Debian the machine's own
//! name resolves to 127.0.1.1, so peers (and rank 0 itself, for `MASTER_ADDR`)
//! would reach nothing.
//!
//! Finding a route binds a UDP socket and `connect`s it, which only consults the
//! routing table: no packet is sent. Not here: choosing what to do when there is
//! no route (the caller falls back to the address of its connection to the head).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The variables naming the interface that a worker's collective libraries bind:
/// gloo (`torch.distributed` on CPU), NCCL's bootstrap and TensorPipe (RPC).
pub(crate) const SOCKET_IFNAME_VARS: [&str; 3] = [
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
];

/// Why no local address or interface was found for a peer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RouteError {
    /// The peer's host name did not resolve.
    #[error("cannot resolve {host}")]
    Resolve {
        /// The host.
        host: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The peer's host name resolved to no address.
    #[error("{host} resolves to no address")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// The routing table has no route to the peer.
    #[error("no route to {addr}")]
    NoRoute {
        /// The peer.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The interfaces could not be listed.
    #[error("cannot list the network interfaces")]
    Interfaces(#[source] nix::Error),
    /// No interface holds the address.
    #[error("no network interface holds {ip}")]
    NoInterface {
        /// The address.
        ip: IpAddr,
    },
}

/// The first address `host` resolves to, with `port`.
pub(crate) async fn resolve(host: &str, port: u16) -> Result<SocketAddr, RouteError> {
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| RouteError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .next()
        .ok_or_else(|| RouteError::NoAddress {
            host: host.to_owned(),
        })
}

/// The local address the kernel sends from to reach `peer`.
pub(crate) fn local_address_to(peer: SocketAddr) -> Result<IpAddr, RouteError> {
    let no_route = |source| RouteError::NoRoute { addr: peer, source };
    let unspecified: IpAddr = match peer {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    // Connecting to port 0 is refused; any port finds the same route.
    let peer = SocketAddr::new(peer.ip(), peer.port().max(1));
    let socket = UdpSocket::bind((unspecified, 0)).map_err(no_route)?;
    socket.connect(peer).map_err(no_route)?;
    Ok(socket.local_addr().map_err(no_route)?.ip())
}

/// The local address of the route to `host`, which the others reach this machine
/// at when `host` is the head.
pub(crate) async fn local_address_toward(host: &str, port: u16) -> Result<IpAddr, RouteError> {
    local_address_to(resolve(host, port).await?)
}

/// The name of the interface holding `ip`.
pub(crate) fn interface_holding(ip: IpAddr) -> Result<String, RouteError> {
    nix::ifaddrs::getifaddrs()
        .map_err(RouteError::Interfaces)?
        .find(|interface| {
            interface.address.as_ref().is_some_and(|address| {
                address.as_sockaddr_in().map(|v4| IpAddr::from(v4.ip())) == Some(ip)
                    || address.as_sockaddr_in6().map(|v6| IpAddr::from(v6.ip())) == Some(ip)
            })
        })
        .map(|interface| interface.interface_name)
        .ok_or(RouteError::NoInterface { ip })
}

/// The `*_SOCKET_IFNAME` variables for a worker whose gang meets at
/// `master_addr`: the interface carrying this machine's route there. Variables
/// for which `already_set` holds (the worker's inherited environment sets them)
/// are left out, so a setting made by hand wins.
pub(crate) async fn socket_ifname_env(
    master_addr: &str,
    master_port: u16,
    already_set: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>, RouteError> {
    let wanted: Vec<&str> = SOCKET_IFNAME_VARS
        .into_iter()
        .filter(|name| !already_set(name))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let local = local_address_toward(master_addr, master_port).await?;
    let interface = interface_holding(local)?;
    Ok(wanted
        .into_iter()
        .map(|name| (name.to_owned(), interface.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_is_reached_from_loopback_on_the_loopback_interface() {
        let local = local_address_toward("127.0.0.1", 29500).await.unwrap();
        assert!(local.is_loopback(), "{local}");
        let interface = interface_holding(local).unwrap();
        assert!(!interface.is_empty());
        let env = socket_ifname_env("127.0.0.1", 29500, |_| false)
            .await
            .unwrap();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, SOCKET_IFNAME_VARS);
        assert!(env.iter().all(|(_, value)| *value == interface));
    }

    #[tokio::test]
    async fn variables_set_by_hand_are_left_alone() {
        let env = socket_ifname_env("127.0.0.1", 29500, |name| name == "NCCL_SOCKET_IFNAME")
            .await
            .unwrap();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"]);
        // Nothing left to find: no route is looked up, so an unknown host is fine.
        let env = socket_ifname_env("no-such-host.invalid", 1, |_| true)
            .await
            .unwrap();
        assert!(env.is_empty());
    }

    #[test]
    fn an_address_no_interface_holds_is_named() {
        // 203.0.113.0/24 is TEST-NET-3: for documentation, held by no real interface.
        let ip: IpAddr = Ipv4Addr::new(203, 0, 113, 254).into();
        assert!(matches!(
            interface_holding(ip),
            Err(RouteError::NoInterface { ip: named }) if named == ip
        ));
    }
}
