//! The LAN layer: a libp2p node (TCP + noise + yamux, IPv4 mDNS, one request-response protocol)
//! that finds contacts on the local network and carries sealed bytes to them directly.
//!
//! - Identity on the wire is the daily LAN key ([`LanKey`]), never an identity key. mDNS shows
//!   its PeerId to the network; nothing else is said to a peer before it proves to be a contact.
//! - Discovery: IPv4 mDNS only; discovered addresses are kept only if they are IPv4 TCP on a
//!   private, link-local or benchmarking (198.18.0.0/15) network ([`is_lan_addr`]). Inbound
//!   connections from other addresses are closed. Connection limits bound what a flood costs.
//! - Binding: the dialer's first request is its hello (its bindings). The listener checks them
//!   against pinned contacts' keys ([`verify_hello`]) and answers with its own bindings only if
//!   they verify; otherwise it refuses and closes. The dialer checks that answer the same way and,
//!   if it verifies, says so with a second hello: each side lists the other as nearby only once
//!   both have accepted. A connection that has not bound within [`LanConfig::hello_timeout`] is
//!   closed. Deliveries from unbound peers are refused.
//! - Delivery: [`LanHandle::deliver`] sends one frame to a bound, connected peer of the contact
//!   and waits at most [`LanConfig::deliver_timeout`] for `Stored`, which the receiver sends only
//!   after the engine committed (the [`InboundReply`] it got with the bytes).
//! - Relay: once a peer is bound both ways, a node with a relay announcement sends it (one
//!   request); a node receiving one checks it against the identity keys that peer proved
//!   ([`RelayAnnouncement::verify`]) and publishes it ([`LanHandle::watch_relays`]). Unbound
//!   peers' announcements are refused unread.
//! - Liveness: the dialer re-sends its hello every [`LanConfig::keepalive`]; a peer silent for
//!   three intervals, or one whose delivery timed out, is disconnected and stops being nearby.
//! - Everything runs in one task that owns the swarm; the handle talks to it over bounded
//!   channels. The task ends (closing every socket) on [`LanHandle::shutdown`] or when the last
//!   handle is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{AsyncReadExt, AsyncWriteExt, FutureExt, StreamExt};
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport, ResponseChannel};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, connection_limits, mdns, noise, tcp, yamux};
use tokio::sync::{mpsc, oneshot, watch};

use crate::protocol::lan::frame::{LEN_PREFIX, body_len};
use crate::protocol::lan::{
    Delivery, LanBinding, LanKey, LanRequest, LanResponse, ProtocolTag, Refusal, RelayAnnouncement, VerifiedRelay,
    verify_hello,
};
use crate::util::now_ms;

/// A contact's row id: what the engine pins keys under and asks to deliver to.
pub type ContactId = i64;
/// Pinned identity keys (each contact's signing keys, minus any blocked by an unverified key
/// change) and their contacts. The engine publishes a new map when contacts change.
pub type Pinned = Arc<BTreeMap<[u8; 32], ContactId>>;

/// The request-response protocol name.
pub const PROTOCOL: &str = "/switchboard/lan/1";

/// Tunables. [`LanConfig::default`] is what the runtime uses.
#[derive(Debug, Clone)]
pub struct LanConfig {
    /// TCP port to listen on (0: any).
    pub port: u16,
    /// Longest wait for a delivery's `Stored`.
    pub deliver_timeout: Duration,
    /// A connection not bound by then is closed.
    pub hello_timeout: Duration,
    /// How often the dialer re-sends its hello (liveness).
    pub keepalive: Duration,
    /// How often mDNS asks the network again.
    pub mdns_query_interval: Duration,
    /// How long a peer that refused us, or that we refused, is not dialled again.
    pub refused_backoff: Duration,
    /// Most established inbound connections.
    pub max_incoming: u32,
    /// Most connections being set up inbound.
    pub max_pending_incoming: u32,
    /// Most connections to one peer.
    pub max_per_peer: u32,
    /// Most hellos judged per second (each tries every pinned key).
    pub hellos_per_second: u32,
    /// Deliveries waiting for the engine before new ones are refused.
    pub inbound_queue: usize,
}

impl Default for LanConfig {
    fn default() -> Self {
        Self {
            port: 0,
            deliver_timeout: Duration::from_secs(2),
            hello_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
            mdns_query_interval: Duration::from_secs(20),
            refused_backoff: Duration::from_secs(300),
            max_incoming: 64,
            max_pending_incoming: 16,
            max_per_peer: 2,
            hellos_per_second: 20,
            inbound_queue: 64,
        }
    }
}

/// LAN layer failures. The engine takes the relay after any of them.
#[derive(Debug, thiserror::Error)]
pub enum LanError {
    /// The contact has no bound connection now (not on this network, or not running).
    #[error("contact is not nearby")]
    NotNearby,
    /// The bytes are larger than a frame carries (local: use the relay).
    #[error("{0}")]
    Frame(#[from] crate::protocol::lan::FrameError),
    /// No answer within the delivery timeout (network or peer).
    #[error("no answer from the peer within {0:?}")]
    Timeout(Duration),
    /// The peer answered that it did not store the bytes.
    #[error("peer refused the delivery: {0:?}")]
    Refused(Refusal),
    /// The connection or stream failed (network or peer).
    #[error("direct delivery failed: {0}")]
    Failed(String),
    /// The node has stopped (local).
    #[error("the LAN layer is not running")]
    Stopped,
    /// The node could not start: socket, mDNS (local).
    #[error("LAN layer could not start: {0}")]
    Start(String),
}

/// Proof that the receiver committed the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored;

/// What the node's identity on the LAN is: the LAN key and the bindings of its PeerId that the
/// profile's identity keys signed.
#[derive(Debug)]
pub struct LanIdentity {
    /// The current LAN key.
    pub key: LanKey,
    /// Its bindings, one per identity key (at most [`crate::protocol::lan::MAX_BINDINGS`]).
    pub bindings: Vec<LanBinding>,
    /// The profile's relay, announced to every peer bound both ways (none: nothing to announce).
    pub relay: Option<RelayAnnouncement>,
}

/// Relays that bound contacts announced (and this node verified) since it started, the latest per
/// contact.
pub type AnnouncedRelays = BTreeMap<ContactId, VerifiedRelay>;

/// Sealed bytes a bound contact delivered directly. Answer through `reply` after the commit.
#[derive(Debug)]
pub struct Inbound {
    /// The contacts the sending peer proved to be (one per identity it bound).
    pub contacts: Vec<ContactId>,
    /// The protocol and bytes.
    pub delivery: Delivery,
    /// The answer the sender waits for.
    pub reply: InboundReply,
}

/// The answer to a direct delivery. Dropping it refuses with `Unavailable`.
#[derive(Debug)]
pub struct InboundReply(oneshot::Sender<LanResponse>);

impl InboundReply {
    /// The bytes are committed (or were already): the sender may forget them.
    pub fn stored(self) {
        let _ = self.0.send(LanResponse::Stored);
    }

    /// Not stored: the sender takes the relay.
    pub fn refuse(self, why: Refusal) {
        let _ = self.0.send(LanResponse::Refused(why));
    }
}

enum Command {
    Deliver { contact: ContactId, delivery: Delivery, reply: oneshot::Sender<Result<Stored, LanError>> },
    Shutdown,
}

/// The engine's handle on a running node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LanHandle {
    cmd: mpsc::Sender<Command>,
    nearby: watch::Receiver<BTreeSet<ContactId>>,
    listening: watch::Receiver<Vec<Multiaddr>>,
    relays: watch::Receiver<AnnouncedRelays>,
    peer_id: PeerId,
    deliver_timeout: Duration,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Deliver { contact, .. } => write!(f, "Deliver({contact})"),
            Command::Shutdown => write!(f, "Shutdown"),
        }
    }
}

impl LanHandle {
    /// Contacts with a bound, live connection now.
    pub fn nearby(&self) -> BTreeSet<ContactId> {
        self.nearby.borrow().clone()
    }

    /// A receiver that changes whenever the nearby set does.
    pub fn watch_nearby(&self) -> watch::Receiver<BTreeSet<ContactId>> {
        self.nearby.clone()
    }

    /// A receiver that changes whenever a bound contact announced a relay that verified.
    pub fn watch_relays(&self) -> watch::Receiver<AnnouncedRelays> {
        self.relays.clone()
    }

    /// The addresses the node listens on.
    pub fn listening(&self) -> Vec<Multiaddr> {
        self.listening.borrow().clone()
    }

    /// This node's PeerId (what mDNS shows).
    pub fn peer_id(&self) -> String {
        self.peer_id.to_string()
    }

    /// Delivers `sealed` to `contact` directly: `Ok(Stored)` once the receiver committed it,
    /// within the delivery timeout; any error means "take the relay".
    pub async fn deliver(
        &self,
        contact: ContactId,
        protocol: ProtocolTag,
        sealed: Vec<u8>,
    ) -> Result<Stored, LanError> {
        let delivery = Delivery::new(protocol, sealed)?;
        let (tx, rx) = oneshot::channel();
        // The node answers within its own deadline (and un-lists the peer first); this one only
        // guards against a node that stopped answering altogether.
        let deadline = self.deliver_timeout + Duration::from_secs(1);
        let send = self.cmd.send(Command::Deliver { contact, delivery, reply: tx });
        match tokio::time::timeout(deadline, async move {
            send.await.map_err(|_| LanError::Stopped)?;
            rx.await.map_err(|_| LanError::Stopped)?
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(LanError::Timeout(self.deliver_timeout)),
        }
    }

    /// Stops the node and closes its sockets.
    pub async fn shutdown(&self) {
        let _ = self.cmd.send(Command::Shutdown).await;
    }

    /// Whether the node's task is still running.
    pub fn is_running(&self) -> bool {
        !self.cmd.is_closed()
    }
}

/// Whether `ip` may be dialled or accepted as a LAN peer: private (RFC 1918), link-local or the
/// benchmarking range 198.18.0.0/15; never loopback, unspecified, broadcast or multicast.
pub fn is_lan_ip(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    let benchmarking = a == 198 && (b & 0xfe) == 18;
    (ip.is_private() || ip.is_link_local() || benchmarking)
        && !ip.is_loopback()
        && !ip.is_unspecified()
        && !ip.is_broadcast()
        && !ip.is_multicast()
}

/// The dialable `/ip4/A/tcp/P` part of a discovered address, if it is on the LAN.
pub fn is_lan_addr(addr: &Multiaddr) -> Option<Multiaddr> {
    let mut it = addr.iter();
    let ip = match it.next()? {
        Protocol::Ip4(ip) if is_lan_ip(ip) => ip,
        _ => return None,
    };
    let port = match it.next()? {
        Protocol::Tcp(p) if p != 0 => p,
        _ => return None,
    };
    match it.next() {
        None | Some(Protocol::P2p(_)) => {}
        Some(_) => return None,
    }
    Some(Multiaddr::empty().with(Protocol::Ip4(ip)).with(Protocol::Tcp(port)))
}

/// Frames on a stream: a length prefix checked before the body is read.
#[derive(Debug, Clone, Copy, Default)]
struct LanCodec;

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

async fn read_body<T: futures_util::AsyncRead + Unpin + Send>(io: &mut T) -> io::Result<Vec<u8>> {
    let mut prefix = [0u8; LEN_PREFIX];
    io.read_exact(&mut prefix).await?;
    let len = body_len(prefix).map_err(invalid)?;
    let mut body = vec![0u8; len];
    io.read_exact(&mut body).await?;
    Ok(body)
}

impl request_response::Codec for LanCodec {
    type Protocol = StreamProtocol;
    type Request = LanRequest;
    type Response = LanResponse;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<LanRequest>
    where
        T: futures_util::AsyncRead + Unpin + Send,
    {
        LanRequest::decode_body(&read_body(io).await?).map_err(invalid)
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<LanResponse>
    where
        T: futures_util::AsyncRead + Unpin + Send,
    {
        LanResponse::decode_body(&read_body(io).await?).map_err(invalid)
    }

    async fn write_request<T>(&mut self, _: &StreamProtocol, io: &mut T, req: LanRequest) -> io::Result<()>
    where
        T: futures_util::AsyncWrite + Unpin + Send,
    {
        io.write_all(&req.encode()).await?;
        io.close().await
    }

    async fn write_response<T>(&mut self, _: &StreamProtocol, io: &mut T, resp: LanResponse) -> io::Result<()>
    where
        T: futures_util::AsyncWrite + Unpin + Send,
    {
        io.write_all(&resp.encode()).await?;
        io.close().await
    }
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    limits: connection_limits::Behaviour,
    mdns: mdns::tokio::Behaviour,
    rr: request_response::Behaviour<LanCodec>,
}

/// What we know of one peer.
#[derive(Debug, Default)]
struct PeerState {
    /// Open connections.
    connections: u32,
    /// When the first of them opened.
    connected_at: Option<Instant>,
    /// Identity keys it proved, and until when.
    bound: Option<(Vec<[u8; 32]>, i64)>,
    /// It also accepted our bindings: as dialer, its answer to our hello carried its bindings; as
    /// listener, it sent a second hello after our answer. Only then is it nearby.
    mutual: bool,
    /// Last request or response from it.
    last_seen: Option<Instant>,
    /// Whether we dialled (we keep the connection alive with hellos).
    dialer: bool,
}

enum Pending {
    Hello(PeerId),
    Relay(PeerId),
    Deliver(PeerId, oneshot::Sender<Result<Stored, LanError>>),
}

type DeadlineFuture = BoxFuture<'static, OutboundRequestId>;

/// Starts a node: listens on `0.0.0.0:port`, runs mDNS, and returns the handle and the stream of
/// direct deliveries. The node runs on its own thread and tokio runtime: when it stops, dropping
/// that runtime ends every task the swarm spawned (mDNS keeps a socket per interface in tasks of
/// its own that outlive the swarm otherwise), so no LAN socket stays open.
pub fn start(
    identity: LanIdentity,
    pinned: watch::Receiver<Pinned>,
    config: LanConfig,
) -> Result<(LanHandle, mpsc::Receiver<Inbound>), LanError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("switchboard-lan".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(LanError::Start(format!("runtime: {e}"))));
                    return;
                }
            };
            rt.block_on(async move {
                match build(identity, pinned, config) {
                    Ok((node, cmd_rx, handle, inbound_rx)) => {
                        let _ = tx.send(Ok((handle, inbound_rx)));
                        node.run(cmd_rx).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
            // `rt` drops here, and with it every task the node spawned.
        })
        .map_err(|e| LanError::Start(format!("thread: {e}")))?;
    rx.recv().map_err(|_| LanError::Start("the node's thread ended".into()))?
}

type Built = (Node, mpsc::Receiver<Command>, LanHandle, mpsc::Receiver<Inbound>);

/// Builds the swarm and the node inside the node's runtime.
fn build(identity: LanIdentity, pinned: watch::Receiver<Pinned>, config: LanConfig) -> Result<Built, LanError> {
    let keypair = libp2p::identity::Keypair::ed25519_from_bytes(*identity.key.seed())
        .map_err(|e| LanError::Start(format!("LAN key: {e}")))?;
    let peer_id = keypair.public().to_peer_id();
    let limits = connection_limits::ConnectionLimits::default()
        .with_max_established_incoming(Some(config.max_incoming))
        .with_max_pending_incoming(Some(config.max_pending_incoming))
        .with_max_established_per_peer(Some(config.max_per_peer))
        .with_max_pending_outgoing(Some(32));
    // IPv6 mDNS in rust-libp2p uses one interface only; IPv4 covers the LAN.
    let mdns_config =
        mdns::Config { enable_ipv6: false, query_interval: config.mdns_query_interval, ..Default::default() };
    let rr_config = request_response::Config::default()
        .with_request_timeout(config.deliver_timeout)
        .with_max_concurrent_streams(32);
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
        .map_err(|e| LanError::Start(format!("transport: {e}")))?
        .with_behaviour(|key| -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
            Ok(Behaviour {
                limits: connection_limits::Behaviour::new(limits),
                mdns: mdns::tokio::Behaviour::new(mdns_config, key.public().to_peer_id())?,
                rr: request_response::Behaviour::with_codec(
                    LanCodec,
                    [(StreamProtocol::new(PROTOCOL), ProtocolSupport::Full)],
                    rr_config,
                ),
            })
        })
        .map_err(|e| LanError::Start(format!("behaviour: {e}")))?
        // Every request opens a substream. With multistream-select's lazy dialer the protocol
        // proposal and the request go out together instead of waiting a round trip for the
        // listener's confirmation: both sides speak exactly one protocol, so nothing is lost by
        // not asking first, and each delivery saves one round trip (the relay path reuses a
        // kept-alive connection and pays none).
        .with_swarm_config(|c| {
            c.with_idle_connection_timeout(config.keepalive * 4)
                .with_substream_upgrade_protocol_override(libp2p::core::upgrade::Version::V1Lazy)
        })
        .build();
    let listen = Multiaddr::empty().with(Protocol::Ip4(Ipv4Addr::UNSPECIFIED)).with(Protocol::Tcp(config.port));
    swarm.listen_on(listen).map_err(|e| LanError::Start(format!("listen: {e}")))?;

    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let (inbound_tx, inbound_rx) = mpsc::channel(config.inbound_queue.max(1));
    let (nearby_tx, nearby_rx) = watch::channel(BTreeSet::new());
    let (listen_tx, listen_rx) = watch::channel(Vec::new());
    let (relays_tx, relays_rx) = watch::channel(BTreeMap::new());
    let handle = LanHandle {
        cmd: cmd_tx,
        nearby: nearby_rx,
        listening: listen_rx,
        relays: relays_rx,
        peer_id,
        deliver_timeout: config.deliver_timeout,
    };
    let node = Node {
        swarm,
        bindings: identity.bindings,
        relay: identity.relay,
        announced: relays_tx,
        pinned,
        config,
        peers: HashMap::new(),
        discovered: HashMap::new(),
        refused: HashMap::new(),
        retry: HashMap::new(),
        pending: HashMap::new(),
        deadlines: FuturesUnordered::new(),
        replies: FuturesUnordered::new(),
        inbound: inbound_tx,
        nearby: nearby_tx,
        listening: listen_tx,
        hello_budget: 0,
        hello_window: Instant::now(),
    };
    Ok((node, cmd_rx, handle, inbound_rx))
}

type ReplyFuture = BoxFuture<'static, (ResponseChannel<LanResponse>, LanResponse)>;

struct Node {
    swarm: Swarm<Behaviour>,
    bindings: Vec<LanBinding>,
    relay: Option<RelayAnnouncement>,
    announced: watch::Sender<AnnouncedRelays>,
    pinned: watch::Receiver<Pinned>,
    config: LanConfig,
    peers: HashMap<PeerId, PeerState>,
    /// LAN addresses mDNS reported, until it expires them.
    discovered: HashMap<PeerId, Vec<Multiaddr>>,
    /// Peers not to dial before the instant (refused either way).
    refused: HashMap<PeerId, Instant>,
    /// Dial backoff: next attempt and current delay.
    retry: HashMap<PeerId, (Instant, Duration)>,
    pending: HashMap<OutboundRequestId, Pending>,
    /// One per delivery in flight: resolves at its deadline.
    deadlines: FuturesUnordered<DeadlineFuture>,
    replies: FuturesUnordered<ReplyFuture>,
    inbound: mpsc::Sender<Inbound>,
    nearby: watch::Sender<BTreeSet<ContactId>>,
    listening: watch::Sender<Vec<Multiaddr>>,
    hello_budget: u32,
    hello_window: Instant,
}

impl Node {
    async fn run(mut self, mut cmd: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_keepalive = Instant::now();
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm(event),
                c = cmd.recv() => match c {
                    Some(Command::Deliver { contact, delivery, reply }) => self.deliver(contact, delivery, reply),
                    Some(Command::Shutdown) | None => break,
                },
                Some((channel, response)) = self.replies.next(), if !self.replies.is_empty() => {
                    let _ = self.swarm.behaviour_mut().rr.send_response(channel, response);
                }
                Some(id) = self.deadlines.next(), if !self.deadlines.is_empty() => self.deliver_deadline(id),
                _ = tick.tick() => {
                    let keepalive = last_keepalive.elapsed() >= self.config.keepalive;
                    if keepalive {
                        last_keepalive = Instant::now();
                    }
                    self.housekeeping(keepalive);
                }
                changed = self.pinned.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.publish_nearby();
                }
            }
        }
        tracing::debug!("lan: node stopped");
    }

    /// The contacts `peer` proved to be; only if it also accepted us when `mutual`.
    fn contacts_of(&self, peer: &PeerId, mutual: bool) -> Vec<ContactId> {
        let Some(state) = self.peers.get(peer) else { return Vec::new() };
        let Some((keys, expires)) = &state.bound else { return Vec::new() };
        if *expires <= now_ms() || state.connections == 0 || (mutual && !state.mutual) {
            return Vec::new();
        }
        let pinned = self.pinned.borrow();
        keys.iter().filter_map(|k| pinned.get(k).copied()).collect()
    }

    fn publish_nearby(&mut self) {
        let set: BTreeSet<ContactId> = self.peers.keys().flat_map(|p| self.contacts_of(p, true)).collect();
        self.nearby.send_if_modified(|old| {
            if *old == set {
                false
            } else {
                *old = set;
                true
            }
        });
    }

    fn refuse_peer(&mut self, peer: PeerId, why: &str) {
        tracing::info!("lan: refusing {peer}: {why}");
        self.refused.insert(peer, Instant::now() + self.config.refused_backoff);
        if let Some(state) = self.peers.get_mut(&peer) {
            state.bound = None;
            state.mutual = false;
        }
        let _ = self.swarm.disconnect_peer_id(peer);
        self.publish_nearby();
    }

    fn hello_allowed(&mut self) -> bool {
        if self.hello_window.elapsed() >= Duration::from_secs(1) {
            self.hello_window = Instant::now();
            self.hello_budget = 0;
        }
        self.hello_budget += 1;
        self.hello_budget <= self.config.hellos_per_second
    }

    /// Judges a peer's bindings; on success records what it proved. `answer` says the bindings
    /// answered our hello (so the peer accepted ours); a hello from a peer already bound says the
    /// same.
    fn judge_hello(&mut self, peer: PeerId, bindings: &[LanBinding], answer: bool) -> bool {
        let verdict = {
            let pinned = self.pinned.borrow();
            verify_hello(bindings, &peer.to_bytes(), now_ms(), &**pinned)
        };
        match verdict {
            Ok(bound) => {
                let keys = bound.contacts.iter().map(|c| c.identity).collect();
                let state = self.peers.entry(peer).or_default();
                let was_mutual = state.mutual;
                state.mutual |= answer || state.bound.is_some();
                let now_mutual = !was_mutual && state.mutual;
                state.bound = Some((keys, bound.expires_at_ms));
                state.last_seen = Some(Instant::now());
                self.retry.remove(&peer);
                self.publish_nearby();
                if now_mutual && let Some(relay) = self.relay.clone() {
                    // Both sides accepted each other: the peer takes our announcement.
                    let id = self.swarm.behaviour_mut().rr.send_request(&peer, LanRequest::Relay(relay));
                    self.pending.insert(id, Pending::Relay(peer));
                }
                true
            }
            Err(e) => {
                self.refuse_peer(peer, &e.to_string());
                false
            }
        }
    }

    fn on_swarm(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::debug!("lan: listening on {address}");
                self.listening.send_modify(|v| v.push(address));
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.listening.send_modify(|v| v.retain(|a| *a != address));
            }
            SwarmEvent::ConnectionEstablished { peer_id, connection_id, endpoint, .. } => {
                let remote = match &endpoint {
                    ConnectedPoint::Dialer { address, .. } => address,
                    ConnectedPoint::Listener { send_back_addr, .. } => send_back_addr,
                };
                let refused = self.refused.get(&peer_id).is_some_and(|until| *until > Instant::now());
                if is_lan_addr(remote).is_none() || refused {
                    tracing::debug!("lan: closing connection from {remote} ({peer_id})");
                    self.swarm.close_connection(connection_id);
                    return;
                }
                let state = self.peers.entry(peer_id).or_default();
                state.connections += 1;
                state.connected_at.get_or_insert_with(Instant::now);
                if endpoint.is_dialer() {
                    state.dialer = true;
                    self.send_hello(peer_id);
                }
            }
            SwarmEvent::ConnectionClosed { peer_id, num_established, .. } => {
                if let Some(state) = self.peers.get_mut(&peer_id) {
                    state.connections = num_established;
                    if num_established == 0 {
                        self.peers.remove(&peer_id);
                    }
                }
                self.publish_nearby();
            }
            SwarmEvent::OutgoingConnectionError { peer_id: Some(peer), error, .. } => {
                tracing::debug!("lan: dial {peer} failed: {error}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(list))) => {
                for (peer, addr) in list {
                    if peer == *self.swarm.local_peer_id() {
                        continue;
                    }
                    if let Some(addr) = is_lan_addr(&addr) {
                        let addrs = self.discovered.entry(peer).or_default();
                        if !addrs.contains(&addr) {
                            addrs.push(addr);
                        }
                    }
                }
                self.dial_discovered();
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Expired(list))) => {
                for (peer, addr) in list {
                    if let Some(addrs) = self.discovered.get_mut(&peer) {
                        addrs.retain(|a| Some(a) != is_lan_addr(&addr).as_ref());
                        if addrs.is_empty() {
                            self.discovered.remove(&peer);
                        }
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Rr(event)) => self.on_rr(event),
            _ => {}
        }
    }

    fn send_hello(&mut self, peer: PeerId) {
        let id = self.swarm.behaviour_mut().rr.send_request(&peer, LanRequest::Hello(self.bindings.clone()));
        self.pending.insert(id, Pending::Hello(peer));
    }

    fn on_rr(&mut self, event: request_response::Event<LanRequest, LanResponse>) {
        use request_response::{Event, Message};
        match event {
            Event::Message { peer, message: Message::Request { request, channel, .. }, .. } => {
                if let Some(state) = self.peers.get_mut(&peer) {
                    state.last_seen = Some(Instant::now());
                }
                self.on_request(peer, request, channel);
            }
            Event::Message { peer, message: Message::Response { request_id, response }, .. } => {
                if let Some(state) = self.peers.get_mut(&peer) {
                    state.last_seen = Some(Instant::now());
                }
                match (self.pending.remove(&request_id), response) {
                    (Some(Pending::Hello(p)), LanResponse::Hello(bindings)) => {
                        let first = self.peers.get(&p).is_some_and(|s| !s.mutual);
                        if self.judge_hello(p, &bindings, true) && first {
                            // Tell the listener at once that we accepted it.
                            self.send_hello(p);
                        }
                    }
                    (Some(Pending::Relay(p)), answer) => {
                        tracing::debug!("lan: {p} answered our relay announcement with {answer:?}");
                    }
                    (Some(Pending::Hello(p)), other) => {
                        self.refuse_peer(p, &format!("answered our hello with {other:?}"));
                    }
                    (Some(Pending::Deliver(_, reply)), LanResponse::Stored) => {
                        let _ = reply.send(Ok(Stored));
                    }
                    (Some(Pending::Deliver(_, reply)), LanResponse::Refused(why)) => {
                        let _ = reply.send(Err(LanError::Refused(why)));
                    }
                    (Some(Pending::Deliver(p, reply)), LanResponse::Hello(_)) => {
                        let _ = reply.send(Err(LanError::Failed("peer answered a delivery with a hello".into())));
                        self.refuse_peer(p, "answered a delivery with a hello");
                    }
                    (None, _) => {}
                }
            }
            Event::OutboundFailure { peer, request_id, error, .. } => {
                tracing::debug!("lan: request to {peer} failed: {error}");
                // Whatever failed, this connection is suspect: the peer stops being nearby
                // before the engine hears of the failure, so its next message takes the relay
                // without trying the link again.
                // A request whose deadline already un-listed the peer says nothing new (and must
                // not un-list a connection made since).
                match self.pending.remove(&request_id) {
                    Some(Pending::Deliver(_, reply)) => {
                        self.unlist(peer);
                        let err = match error {
                            request_response::OutboundFailure::Timeout => {
                                LanError::Timeout(self.config.deliver_timeout)
                            }
                            other => LanError::Failed(other.to_string()),
                        };
                        let _ = reply.send(Err(err));
                    }
                    Some(Pending::Hello(_)) => self.unlist(peer),
                    Some(Pending::Relay(_)) | None => {}
                }
            }
            Event::InboundFailure { peer, error, .. } => {
                tracing::debug!("lan: request from {peer} failed: {error}");
            }
            Event::ResponseSent { .. } => {}
        }
    }

    fn on_request(&mut self, peer: PeerId, request: LanRequest, channel: ResponseChannel<LanResponse>) {
        match request {
            LanRequest::Hello(bindings) => {
                if !self.hello_allowed() {
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .rr
                        .send_response(channel, LanResponse::Refused(Refusal::Unavailable));
                    return;
                }
                let response = if self.judge_hello(peer, &bindings, false) {
                    LanResponse::Hello(self.bindings.clone())
                } else {
                    LanResponse::Refused(Refusal::NotBound)
                };
                let _ = self.swarm.behaviour_mut().rr.send_response(channel, response);
            }
            LanRequest::Relay(announcement) => {
                let response = self.judge_relay(peer, &announcement);
                let _ = self.swarm.behaviour_mut().rr.send_response(channel, response);
            }
            LanRequest::Deliver(delivery) => {
                let contacts = self.contacts_of(&peer, false);
                if contacts.is_empty() {
                    let _ =
                        self.swarm.behaviour_mut().rr.send_response(channel, LanResponse::Refused(Refusal::NotBound));
                    return;
                }
                let (tx, rx) = oneshot::channel();
                let inbound = Inbound { contacts, delivery, reply: InboundReply(tx) };
                if let Err(e) = self.inbound.try_send(inbound) {
                    // The engine is behind (or gone): the sender takes the relay.
                    e.into_inner().reply.refuse(Refusal::Unavailable);
                }
                let wait = self.config.deliver_timeout;
                self.replies.push(
                    async move {
                        let response = match tokio::time::timeout(wait, rx).await {
                            Ok(Ok(r)) => r,
                            _ => LanResponse::Refused(Refusal::Unavailable),
                        };
                        (channel, response)
                    }
                    .boxed(),
                );
            }
        }
    }

    /// Judges a relay announcement: only from a bound peer, only signed by one of the identity
    /// keys it proved (and still pinned); a verified one is published for the engine.
    fn judge_relay(&mut self, peer: PeerId, announcement: &RelayAnnouncement) -> LanResponse {
        if self.contacts_of(&peer, false).is_empty() {
            tracing::info!("lan: relay announcement from unbound {peer} refused");
            return LanResponse::Refused(Refusal::NotBound);
        }
        let keys = self.peers.get(&peer).and_then(|s| s.bound.as_ref()).map(|(k, _)| k.clone()).unwrap_or_default();
        let verdict = announcement.verify(keys.iter(), now_ms()).and_then(|v| {
            self.pinned
                .borrow()
                .get(&v.identity)
                .copied()
                .map(|c| (c, v))
                .ok_or(crate::protocol::lan::AnnounceError::Foreign)
        });
        match verdict {
            Ok((contact, relay)) => {
                tracing::info!("lan: contact {contact} announced its relay {} ({peer})", relay.url);
                self.announced.send_if_modified(|m| {
                    if m.get(&contact) == Some(&relay) {
                        false
                    } else {
                        m.insert(contact, relay);
                        true
                    }
                });
                LanResponse::Stored
            }
            Err(e) => {
                tracing::info!("lan: relay announcement from {peer} refused: {e}");
                LanResponse::Refused(Refusal::Invalid)
            }
        }
    }

    fn deliver(&mut self, contact: ContactId, delivery: Delivery, reply: oneshot::Sender<Result<Stored, LanError>>) {
        let peer = self.peers.keys().copied().find(|p| self.contacts_of(p, true).contains(&contact));
        let Some(peer) = peer else {
            let _ = reply.send(Err(LanError::NotNearby));
            return;
        };
        let id = self.swarm.behaviour_mut().rr.send_request(&peer, LanRequest::Deliver(delivery));
        self.pending.insert(id, Pending::Deliver(peer, reply));
        let wait = self.config.deliver_timeout;
        self.deadlines.push(
            async move {
                tokio::time::sleep(wait).await;
                id
            }
            .boxed(),
        );
    }

    /// A delivery's deadline passed. If it is still unanswered, the peer is un-listed (and its
    /// connection dropped) before the engine is told, so the engine takes the relay now and does
    /// not try this link for the next message either: over a cut link nothing else would say so
    /// until TCP gives up.
    fn deliver_deadline(&mut self, id: OutboundRequestId) {
        let (peer, reply) = match self.pending.remove(&id) {
            Some(Pending::Deliver(peer, reply)) => (peer, reply),
            Some(other @ (Pending::Hello(_) | Pending::Relay(_))) => {
                self.pending.insert(id, other);
                return;
            }
            None => return,
        };
        tracing::info!(
            "lan: delivery to {peer} unanswered after {:?}; not nearby any more",
            self.config.deliver_timeout
        );
        self.unlist(peer);
        let _ = reply.send(Err(LanError::Timeout(self.config.deliver_timeout)));
    }

    /// Forgets a peer's binding and drops its connection; mDNS and a fresh hello bring it back.
    fn unlist(&mut self, peer: PeerId) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.bound = None;
            state.mutual = false;
        }
        let _ = self.swarm.disconnect_peer_id(peer);
        self.publish_nearby();
    }

    fn dial_discovered(&mut self) {
        let now = Instant::now();
        self.refused.retain(|_, until| *until > now);
        let candidates: Vec<(PeerId, Vec<Multiaddr>)> = self
            .discovered
            .iter()
            .filter(|(p, _)| !self.peers.contains_key(*p) && !self.refused.contains_key(*p))
            .filter(|(p, _)| self.retry.get(*p).is_none_or(|(at, _)| *at <= now))
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        for (peer, addrs) in candidates {
            let delay =
                self.retry.get(&peer).map_or(Duration::from_secs(2), |(_, d)| (*d * 2).min(Duration::from_secs(60)));
            self.retry.insert(peer, (now + jittered(delay), delay));
            if let Err(e) = self.swarm.dial(dial_opts(peer, addrs)) {
                tracing::debug!("lan: dial {peer}: {e}");
            }
        }
    }

    fn housekeeping(&mut self, keepalive: bool) {
        let now = Instant::now();
        let mut drop = Vec::new();
        for (peer, state) in &self.peers {
            let unbound_too_long =
                state.bound.is_none() && state.connected_at.is_some_and(|t| now - t > self.config.hello_timeout);
            let silent = state.last_seen.is_some_and(|t| now - t > self.config.keepalive * 3);
            let expired = state.bound.as_ref().is_some_and(|(_, exp)| *exp <= now_ms());
            if unbound_too_long || silent || expired {
                drop.push(*peer);
            }
        }
        for peer in drop {
            tracing::debug!("lan: disconnecting {peer} (unbound, silent or expired)");
            let _ = self.swarm.disconnect_peer_id(peer);
            self.peers.remove(&peer);
        }
        if keepalive {
            let dialled: Vec<PeerId> =
                self.peers.iter().filter(|(_, s)| s.dialer && s.bound.is_some()).map(|(p, _)| *p).collect();
            for peer in dialled {
                self.send_hello(peer);
            }
        }
        self.publish_nearby();
        self.dial_discovered();
    }
}

/// How a discovered contact is dialled. From a fresh local port: libp2p's default reuses the
/// listening port, so when two contacts discover each other at the same instant (they usually
/// do: each answers the other's mDNS query) their dials share one address pair, TCP's
/// simultaneous open merges them into one connection and both sides start noise as initiator,
/// which fails; with the same retry schedule on both sides it failed again at every retry.
fn dial_opts(peer: PeerId, addrs: Vec<Multiaddr>) -> DialOpts {
    DialOpts::peer_id(peer)
        .addresses(addrs)
        .condition(PeerCondition::DisconnectedAndNotDialing)
        .allocate_new_port()
        .build()
}

/// `delay` plus up to a quarter more, at random, so that two peers retrying each other do not
/// stay in step.
fn jittered(delay: Duration) -> Duration {
    let [r] = crate::util::random_array::<1>();
    delay + delay / 4 * u32::from(r) / 255
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lan_addresses_are_dialled() {
        let ok = |s: &str| is_lan_addr(&s.parse().unwrap()).map(|a| a.to_string());
        assert_eq!(ok("/ip4/198.18.0.2/tcp/4001"), Some("/ip4/198.18.0.2/tcp/4001".into()));
        assert_eq!(
            ok("/ip4/192.168.1.5/tcp/4001/p2p/12D3KooWGzZ7Ziff6DgVLHxqGpu4FrVJi8bSwuhUtbZdqxqfDmnn"),
            Some("/ip4/192.168.1.5/tcp/4001".into())
        );
        assert_eq!(ok("/ip4/10.0.0.1/tcp/1"), Some("/ip4/10.0.0.1/tcp/1".into()));
        assert_eq!(ok("/ip4/169.254.3.4/tcp/1"), Some("/ip4/169.254.3.4/tcp/1".into()));
        for refused in [
            "/ip4/127.0.0.1/tcp/4001",
            "/ip4/0.0.0.0/tcp/4001",
            "/ip4/8.8.8.8/tcp/4001",
            "/ip4/198.20.0.1/tcp/4001",
            "/ip4/224.0.0.251/tcp/4001",
            "/ip4/198.18.0.2/tcp/0",
            "/ip4/198.18.0.2/udp/4001/quic-v1",
            "/ip6/fe80::1/tcp/4001",
            "/ip4/198.18.0.2/tcp/4001/ws",
        ] {
            assert_eq!(ok(refused), None, "{refused} was accepted");
        }
    }

    /// A contact is dialled from a fresh port, never from the listening one. When two contacts
    /// discover each other from the same mDNS exchange they dial each other at once; from their
    /// listening ports both dials are one address pair, TCP's simultaneous open merges them into
    /// one connection on which both sides start noise as initiator, and both fail ("Handshake
    /// failed: input error"; seen in `lan_netns`, where the retries stayed in step and failed
    /// too). Loopback never crosses two SYNs, so this checks the cause: the port the listener
    /// sees the dial come from.
    #[tokio::test]
    async fn contacts_are_dialled_from_a_fresh_port() {
        use libp2p::swarm::dummy;
        async fn node() -> (Swarm<dummy::Behaviour>, Multiaddr) {
            let mut swarm = libp2p::SwarmBuilder::with_new_identity()
                .with_tokio()
                .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
                .unwrap()
                .with_behaviour(|_| dummy::Behaviour)
                .unwrap()
                .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(30)))
                .build();
            swarm.listen_on("/ip4/127.0.0.1/tcp/0".parse().unwrap()).unwrap();
            loop {
                if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                    return (swarm, address);
                }
            }
        }
        let port = |a: &Multiaddr| a.iter().find_map(|p| if let Protocol::Tcp(p) = p { Some(p) } else { None });
        let (mut a, a_addr) = node().await;
        let (mut b, b_addr) = node().await;
        let b_id = *b.local_peer_id();
        a.dial(dial_opts(b_id, vec![b_addr])).unwrap();
        let from = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                tokio::select! {
                    e = a.select_next_some() => {
                        if let SwarmEvent::OutgoingConnectionError { error, .. } = e {
                            panic!("dial failed: {error}");
                        }
                    }
                    e = b.select_next_some() => {
                        if let SwarmEvent::ConnectionEstablished { endpoint, .. } = e
                            && let ConnectedPoint::Listener { send_back_addr, .. } = endpoint
                        {
                            return send_back_addr;
                        }
                    }
                }
            }
        })
        .await
        .expect("no connection in 10 s");
        assert_ne!(port(&from), port(&a_addr), "dialled from the listening port: {from} (listening on {a_addr})");
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        let d = Duration::from_secs(8);
        for _ in 0..1000 {
            let j = jittered(d);
            assert!(j >= d && j <= d + d / 4, "{j:?}");
        }
    }

    #[test]
    fn lan_key_peer_id_matches_libp2p() {
        let key = LanKey::generate(&mut crate::util::SeededRng::new([4; 32]), 0);
        let kp = libp2p::identity::Keypair::ed25519_from_bytes(*key.seed()).unwrap();
        assert_eq!(kp.public().to_peer_id().to_bytes(), key.peer_id_bytes());
    }
}
