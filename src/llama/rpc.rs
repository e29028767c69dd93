//! llama.cpp's RPC backend (ggml-rpc): a server that lends this machine's
//! CPU backend to another process over TCP, and the client side that makes
//! such a server's devices places for a model's layers. Only activations
//! and the weights uploaded at load cross the network; the server computes
//! the layers it holds with the same ggml kernels as a local run.

use std::ffi::{CStr, CString, c_char};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llama_cpp_sys_2 as sys;

// ggml-rpc's C API (ggml-rpc.h), which llama-cpp-sys-2 builds with
// GGML_RPC=ON and links but does not bind.
unsafe extern "C" {
    fn ggml_backend_rpc_start_server(
        endpoint: *const c_char,
        cache_dir: *const c_char,
        n_threads: usize,
        n_devices: usize,
        devices: *mut sys::ggml_backend_dev_t,
    );
    fn ggml_backend_rpc_add_server(endpoint: *const c_char) -> sys::ggml_backend_reg_t;
}

/// How long a client waits for a server to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for a server's answer to its greeting: a server
/// busy with another client leaves a new connection unanswered.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client waits for any answer to a line end it sends after an
/// unanswered greeting (what makes a web server answer).
const NUDGE_TIMEOUT: Duration = Duration::from_secs(1);
/// ggml-rpc's protocol version (`RPC_PROTO_*_VERSION` in `ggml-rpc.h`).
const PROTOCOL: (u8, u8, u8) = (7, 0, 0);
/// The greeting's command number, fixed across protocol versions.
const CMD_HELLO: u8 = 14;
/// Bytes of the transport capabilities in the greeting (`RPC_CONN_CAPS_SIZE`).
const CONN_CAPS: usize = 24;

/// A device handle ggml keeps for the life of the process.
#[derive(Debug, Clone, Copy)]
pub(super) struct DevicePtr(pub(super) sys::ggml_backend_dev_t);

// SAFETY: ggml's device objects are process-global, never freed, and safe
// to use from any thread (their calls go through the RPC dispatcher's queue).
unsafe impl Send for DevicePtr {}
// SAFETY: see Send.
unsafe impl Sync for DevicePtr {}

/// One compute device an RPC server offers.
#[derive(Debug, Clone)]
pub struct RemoteDevice {
    /// The server's `HOST:PORT`.
    pub endpoint: String,
    /// ggml's name for it (`RPC0`, `RPC1`, ...).
    pub name: String,
    /// Memory the server reports free, in bytes.
    pub free_bytes: u64,
    /// Memory the server reports in all, in bytes.
    pub total_bytes: u64,
    /// The address it answered on.
    pub addr: SocketAddr,
    pub(super) dev: DevicePtr,
}

/// Which layers RPC devices hold. llama.cpp gives a model's last layers
/// to its devices, in order, with the output head on the last one; the
/// first `n_layer - total` layers stay in this process.
#[derive(Debug, Clone, Default)]
pub struct RemoteLayers {
    /// The devices, in the order they take layers.
    pub devices: Vec<RemoteDevice>,
    /// Layers each device holds.
    pub layers: Vec<u32>,
    /// The model's layers.
    pub n_layer: u32,
}

impl RemoteLayers {
    /// Layers on all devices together.
    pub fn total(&self) -> u32 {
        self.layers.iter().sum()
    }

    /// The first layer not held here.
    pub fn first_remote(&self) -> u32 {
        self.n_layer.saturating_sub(self.total())
    }

    /// Each device's layers, in the order of [`Self::devices`].
    pub fn ranges(&self) -> impl Iterator<Item = std::ops::Range<u32>> + '_ {
        let mut next = self.first_remote();
        self.layers.iter().map(move |&n| {
            next += n;
            next - n..next
        })
    }

    /// The devices that hold at least one layer, with their counts.
    pub fn holding(&self) -> impl Iterator<Item = (&RemoteDevice, u32)> + '_ {
        self.devices.iter().zip(self.layers.iter().copied()).filter(|&(_, n)| n > 0)
    }

    /// llama.cpp's model parameters for this placement: the devices that
    /// hold layers (NULL-terminated), their split and the offloaded layer
    /// count. The split gives each device exactly its count: llama.cpp
    /// places layer `start + k` on the first device whose cumulative share
    /// exceeds `k / (total + 1)`, the `+ 1` being the output head, which
    /// goes with the last device.
    pub(super) fn params(&self) -> (Vec<sys::ggml_backend_dev_t>, Vec<f32>, i32) {
        let mut devices: Vec<_> = self.holding().map(|(d, _)| d.dev.0).collect();
        devices.push(std::ptr::null_mut());
        let mut split: Vec<f32> = self.holding().map(|(_, n)| n as f32).collect();
        if let Some(last) = split.last_mut() {
            *last += 1.0;
        }
        let offloaded = if self.total() > 0 { self.total() as i32 + 1 } else { 0 };
        (devices, split, offloaded)
    }
}

/// Splits `HOST:PORT` (`[V6]:PORT` for an IPv6 address), checking the port.
pub fn parse_endpoint(endpoint: &str) -> Result<(String, u16), String> {
    let bad = |why: &str| format!("RPC endpoint {endpoint:?}: {why} (expected HOST:PORT, e.g. 192.168.1.20:50052)");
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port: u16 = port.parse().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok((host.to_string(), port))
}

/// Connects to the RPC server at `endpoint` and returns the devices it
/// offers. The server is first reached with a plain TCP connection, so a
/// server that is down or unreachable is an error here rather than inside
/// ggml (which would end the process).
pub fn connect(endpoint: &str) -> Result<Vec<RemoteDevice>, String> {
    super::init();
    let (host, port) = parse_endpoint(endpoint)?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("RPC server {endpoint}: cannot resolve {host}: {e}"))?
        .collect();
    // A server this process still talks to (a session open on it, or one
    // left in memory after another of its servers went) serves this
    // process and leaves a new connection waiting, so it cannot be greeted:
    // ggml reuses its connection by the endpoint's name.
    if let Some(&addr) = addrs.iter().find(|&&a| ggml_connected(a)) {
        let names = NAMES.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match names.iter().find(|(a, _)| *a == addr) {
            Some((_, name)) if name != endpoint => {
                return Err(format!(
                    "this process is connected to the RPC server at {addr} as {name}, and a server serves one \
                     client at a time: name it {name} here too"
                ));
            }
            _ => return offered(endpoint, addr),
        }
    }
    let mut last = None;
    let reached = addrs.iter().find_map(|a| match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
        // A connection to a port of this machine that nothing listens on
        // can come back connected to itself (the kernel picked the same
        // port as its own end): it would echo the greeting back.
        Ok(stream) if stream.local_addr().ok() == Some(*a) => {
            last = Some(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            None
        }
        Ok(stream) => Some((*a, stream)),
        Err(e) => {
            last = Some(e);
            None
        }
    });
    let Some((addr, stream)) = reached else {
        let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
        return Err(format!(
            "cannot reach the RPC server at {endpoint}: {why} (is `bmoe rpc-server --host {host} --port {port}` running \
             there?)"
        ));
    };
    greet(stream, endpoint, HELLO_TIMEOUT)?;
    remember_name(addr, endpoint);
    offered(endpoint, addr)
}

/// The devices the server at `endpoint` (reached at `addr`) offers, through
/// ggml, once it has answered a greeting or this process is connected to it.
fn offered(endpoint: &str, addr: SocketAddr) -> Result<Vec<RemoteDevice>, String> {
    let c = CString::new(endpoint).map_err(|_| format!("RPC endpoint {endpoint:?} contains a NUL byte"))?;
    // SAFETY: c is a valid NUL-terminated string; ggml copies it. The server
    // answered a greeting just now; one that stops answering after that
    // still makes ggml abort (reported by the abort hook).
    let reg = unsafe { ggml_backend_rpc_add_server(c.as_ptr()) };
    if reg.is_null() {
        return Err(format!("the RPC server at {endpoint} offers no devices"));
    }
    // SAFETY: reg is a live registry ggml keeps for the process.
    let count = unsafe { sys::ggml_backend_reg_dev_count(reg) };
    let mut devices = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: i < count; devices live as long as their registry.
        let dev = unsafe { sys::ggml_backend_reg_dev_get(reg, i) };
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: dev is live; the outputs are plain integers.
        unsafe { sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
        // SAFETY: ggml returns a NUL-terminated name owned by the device.
        let name = unsafe { CStr::from_ptr(sys::ggml_backend_dev_name(dev)) }.to_string_lossy().into_owned();
        devices.push(RemoteDevice {
            endpoint: endpoint.to_string(),
            name,
            free_bytes: free as u64,
            total_bytes: total as u64,
            addr,
            dev: DevicePtr(dev),
        });
    }
    close_sockets_on_exec();
    Ok(devices)
}

/// True when the kernel saw the server at `addr` close this machine's
/// connection to it (its process ended) and no connection to it is
/// open: ggml would end the process at its next message. Reads the
/// kernel's socket table (Linux); elsewhere, or with no connection to
/// look at, false.
pub fn connection_lost(addr: SocketAddr) -> bool {
    const ESTABLISHED: &str = "01";
    const CLOSE_WAIT: &str = "08";
    let table = if addr.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let Ok(text) = std::fs::read_to_string(table) else { return false };
    let states: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(2);
            let remote = fields.next()?;
            let state = fields.next()?;
            (parse_proc_addr(remote) == Some(addr)).then_some(state)
        })
        .collect();
    states.contains(&CLOSE_WAIT) && !states.contains(&ESTABLISHED)
}

/// Greets the server on `stream` as ggml-rpc does and checks its answer,
/// then hangs up (the server takes it as a client that left). ggml would
/// end the process on a server of another protocol version, and wait
/// forever on one busy with another client; here both are errors, as is
/// something else on the port (a web server, say), told apart from a busy
/// server by what it does with a line end sent after `timeout` of silence.
fn greet(mut stream: TcpStream, endpoint: &str, timeout: Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut hello = vec![CMD_HELLO];
    hello.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
    hello.extend_from_slice(&[0u8; CONN_CAPS]);
    let closed =
        || format!("{endpoint} closed the connection without answering the RPC greeting: is it a `bmoe rpc-server`?");
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ) {
            closed()
        } else {
            format!("the RPC server at {endpoint}: {e}")
        }
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.write_all(&hello).map_err(io)?;
    let mut size = [0u8; 8];
    match stream.read_exact(&mut size) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            return Err(after_silence(stream, endpoint, timeout));
        }
        other => other.map_err(io)?,
    }
    if u64::from_le_bytes(size) != 4 + CONN_CAPS as u64 {
        // Show the first line of what it sent: what came with it, briefly.
        let mut sent = size.to_vec();
        let mut more = [0u8; 56];
        if stream.set_read_timeout(Some(Duration::from_millis(200))).is_ok()
            && let Ok(n) = stream.read(&mut more)
        {
            sent.extend_from_slice(&more[..n]);
        }
        return Err(not_rpc(endpoint, &sent));
    }
    let mut answer = [0u8; 4 + CONN_CAPS];
    stream.read_exact(&mut answer).map_err(io)?;
    let (major, minor, patch) = (answer[0], answer[1], answer[2]);
    if major != PROTOCOL.0 || minor > PROTOCOL.1 {
        return Err(format!(
            "the RPC server at {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this bmoe {}.{}.{}: run the same \
             bmoe build on both machines",
            PROTOCOL.0, PROTOCOL.1, PROTOCOL.2
        ));
    }
    Ok(())
}

/// Why a server that accepted a connection left the greeting unanswered
/// for `waited`. A `bmoe rpc-server` busy with another client has not even
/// taken the connection (it serves one at a time), so a line end sent now
/// waits unread as well; a web server, or another line-based service,
/// answers it (an error page) or hangs up.
fn after_silence(mut stream: TcpStream, endpoint: &str, waited: Duration) -> String {
    use std::io::{Read, Write};
    let mut reply = [0u8; 64];
    let nudged = stream
        .set_read_timeout(Some(NUDGE_TIMEOUT))
        .and_then(|()| stream.write_all(b"\r\n\r\n"))
        .and_then(|()| stream.read(&mut reply));
    match nudged {
        Ok(n) if n > 0 => not_rpc(endpoint, &reply[..n]),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => format!(
            "{endpoint} accepted a connection but did not answer the RPC greeting in {} s: a `bmoe rpc-server` serves \
             one client at a time, so another client is probably using it (or something that is not an RPC server \
             holds the port)",
            waited.as_secs_f64().round()
        ),
        _ => format!(
            "{endpoint} did not answer the RPC greeting in {} s and then closed the connection: is it a `bmoe \
             rpc-server`?",
            waited.as_secs_f64().round()
        ),
    }
}

/// The error for something on the port that answered `bytes` where the
/// RPC greeting's answer belongs.
fn not_rpc(endpoint: &str, bytes: &[u8]) -> String {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let shown: String =
        String::from_utf8_lossy(line).chars().take(40).map(|c| if c.is_control() { '.' } else { c }).collect();
    let shown = shown.trim_end_matches('.');
    // Binary that reads as nothing: its first bytes in hex.
    let shown = if shown.chars().all(|c| c == '.') {
        bytes.iter().take(16).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
    } else {
        shown.to_string()
    };
    format!(
        "{endpoint} did not answer the RPC greeting (it sent `{shown}`): it is not a `bmoe rpc-server`; is the port right?"
    )
}

/// This process's connections to one RPC server, found once, then checked
/// between steps with a non-blocking peek (a syscall per connection;
/// reading the kernel's socket table costs about a millisecond a time).
/// While it lives, the server is listed as in use for [`abort_note`].
#[derive(Debug, Clone)]
pub struct ConnectionWatch {
    addr: SocketAddr,
    /// The connections.
    fds: Vec<Socket>,
    _in_use: Arc<InUse>,
}

/// A socket of this process: its descriptor and inode number.
type Socket = (i32, String);

/// Servers holding layers of a live session: (registration, address, the
/// connections found at open), for [`abort_note`].
static IN_USE: Mutex<Vec<(u64, SocketAddr, Vec<Socket>)>> = Mutex::new(Vec::new());
/// ggml's connections to servers, (address, socket inode), as found once
/// a model loaded; one still open is a server this process talks to.
static GGML_SOCKETS: Mutex<Vec<(SocketAddr, String)>> = Mutex::new(Vec::new());
/// The endpoint each server address was named by, as the user wrote it.
static NAMES: Mutex<Vec<(SocketAddr, String)>> = Mutex::new(Vec::new());

/// One entry of [`IN_USE`], removed when the last watch holding it goes.
#[derive(Debug)]
struct InUse(u64);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut list = IN_USE.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|(id, _, _)| *id != self.0);
    }
}

fn remember_name(addr: SocketAddr, endpoint: &str) {
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    names.retain(|(a, _)| *a != addr);
    names.push((addr, endpoint.to_string()));
}

/// True when a non-blocking peek at `fd` reads the end of the stream or a
/// broken connection (false for a descriptor that is not a socket).
fn peek_ended(fd: i32) -> bool {
    let mut byte = 0u8;
    // SAFETY: a non-blocking peek of at most one byte into a local; it
    // consumes nothing, and a descriptor that is no longer a socket (or is
    // closed) makes it fail with an error that reads as alive.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n == 0
        || (n < 0
            && matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::EHOSTUNREACH)
            ))
}

/// What to tell the user when ggml-rpc is about to end the process because
/// a message to a server failed (ggml's own message names no server): the
/// server whose connection from this process has ended, seen with the same
/// peek as between steps (a server of a live session first, then any this
/// process has reached); when none can be told apart, the servers of live
/// sessions. Called from ggml's abort hook, on the thread that was talking
/// to the server; it takes no lock another thread could hold for long.
pub fn abort_note() -> String {
    const AFTER: &str = "it holds some of the model's layers, so the model cannot go on without it; restart `bmoe \
                         rpc-server` there and open the model again";
    let watched: Vec<(SocketAddr, Vec<Socket>)> =
        IN_USE.try_lock().map(|list| list.iter().map(|(_, a, f)| (*a, f.clone())).collect()).unwrap_or_default();
    let in_use: Vec<SocketAddr> = watched.iter().map(|(a, _)| *a).collect();
    let names: Vec<(SocketAddr, String)> = NAMES.try_lock().map(|n| n.clone()).unwrap_or_default();
    let name =
        |addr: &SocketAddr| names.iter().find(|(a, _)| a == addr).map_or_else(|| addr.to_string(), |(_, e)| e.clone());
    let mut known: Vec<SocketAddr> = in_use.clone();
    known.extend(names.iter().map(|(a, _)| *a).filter(|a| !in_use.contains(a)));
    known.dedup();
    // A connection the server reset has left the socket table, so the
    // ones found at open are peeked first.
    let ended = |addr: &SocketAddr| {
        watched.iter().filter(|(a, _)| a == addr).flat_map(|(_, f)| f).any(|(fd, inode)| socket_ended(*fd, inode))
            || own_sockets(*addr).into_iter().any(|(fd, _)| peek_ended(fd))
            || connection_lost(*addr)
    };
    let gone: Vec<&SocketAddr> = known.iter().filter(|a| ended(a)).collect();
    let gone_in_use: Vec<String> = gone.iter().filter(|a| in_use.contains(a)).map(|a| name(a)).collect();
    let gone: Vec<String> = if gone_in_use.is_empty() { gone.iter().map(|a| name(a)).collect() } else { gone_in_use };
    let mut servers: Vec<String> = in_use.iter().map(name).collect();
    servers.dedup();
    let why = "its connection from this process ended while llama.cpp was waiting on it";
    match (gone.as_slice(), servers.as_slice()) {
        ([one], _) => format!("the RPC server at {one} stopped answering ({why}): {AFTER}"),
        ([_, ..], _) => format!("the RPC servers at {} stopped answering ({why}): {AFTER}", gone.join(", ")),
        ([], []) => format!("an RPC server stopped answering: {AFTER}"),
        ([], [one]) => format!("the RPC server at {one} stopped answering: {AFTER}"),
        ([], all) => format!(
            "an RPC server stopped answering, one of those holding this model's layers ({}): {AFTER}",
            all.join(", ")
        ),
    }
}

impl ConnectionWatch {
    /// Finds this process's sockets connected to `addr` (Linux: by their
    /// inodes in `/proc/self/fd` and the kernel's socket table).
    pub fn new(addr: SocketAddr) -> ConnectionWatch {
        let found = own_sockets(addr);
        GGML_SOCKETS.lock().unwrap_or_else(|p| p.into_inner()).extend(found.iter().map(|(_, i)| (addr, i.clone())));
        let fds = found;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        IN_USE.lock().unwrap_or_else(|p| p.into_inner()).push((id, addr, fds.clone()));
        ConnectionWatch { addr, fds, _in_use: Arc::new(InUse(id)) }
    }

    /// How many connections were found.
    pub fn connections(&self) -> usize {
        self.fds.len()
    }

    /// True when the server has closed or reset this process's connection
    /// to it (its process ended). A peek that reads the end of the stream
    /// (or a reset) is confirmed by the descriptor still naming the same
    /// socket, in case ggml closed it and the number now names another.
    /// Without a connection found at [`Self::new`], the socket table is
    /// read every time.
    pub fn closed(&self) -> bool {
        if self.fds.is_empty() {
            return connection_lost(self.addr);
        }
        self.fds.iter().any(|(fd, inode)| socket_ended(*fd, inode))
    }
}

/// True when descriptor `fd` still names socket `inode` and a peek at it
/// reads the end of the stream or a broken connection.
fn socket_ended(fd: i32, inode: &str) -> bool {
    peek_ended(fd)
        && std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|t| t.to_str().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')) == Some(inode))
}

/// This process's sockets connected to `addr`, by descriptor (Linux: by
/// their inodes in `/proc/self/fd` and the kernel's socket table).
fn own_sockets(addr: SocketAddr) -> Vec<Socket> {
    let table = if addr.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let inodes: Vec<String> = std::fs::read_to_string(table)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 9 && parse_proc_addr(fields[2]) == Some(addr)).then(|| fields[9].to_string())
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let fd = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            let inode = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string();
            inodes.contains(&inode).then_some((fd, inode))
        })
        .collect()
}

/// True when ggml still holds a connection to `addr` that the server has
/// not closed: one found by a [`ConnectionWatch`] (after a model loaded)
/// and still open in this process.
fn ggml_connected(addr: SocketAddr) -> bool {
    let known = GGML_SOCKETS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    own_sockets(addr).into_iter().any(|(fd, inode)| known.contains(&(addr, inode)) && !peek_ended(fd))
}

/// Reads an address of the kernel's socket table: the IP as 32-bit words
/// in host byte order, then the port, in hex (`0100007F:C350`).
fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = ip
        .as_bytes()
        .chunks(8)
        .map(|w| u32::from_str_radix(std::str::from_utf8(w).ok()?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Marks every socket of this process close-on-exec. ggml-rpc opens its
/// connections without the flag, so a child process started while a model
/// holds layers on a server (a bench run, a script's command) would keep
/// the connection open after this process closes it, and the server, which
/// serves one client at a time, would wait on it forever. Rust's own
/// sockets carry the flag already. Linux only (it reads `/proc/self/fd`).
pub fn close_sockets_on_exec() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return };
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let is_socket = std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: fcntl on a descriptor number only reads or sets its flags;
        // one closed meanwhile makes it fail with EBADF, which is ignored.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// This machine's addresses other machines can reach it at: every address
/// of an interface that is up, except loopback and IPv6 link-local ones
/// (which need an interface name to be used), without repeats, in the
/// system's order. Empty where none is configured or the list cannot be read.
pub fn local_addresses() -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list it allocates, freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return found;
    }
    let mut entry = head;
    while !entry.is_null() {
        // SAFETY: entry is a node of the list getifaddrs returned, alive
        // until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says which
        // sockaddr_* it is; each is read as the type its family names.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        let link_local = matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        if !ip.is_loopback() && !ip.is_unspecified() && !link_local && !found.contains(&ip) {
            found.push(ip);
        }
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// What `bmoe rpc-server` serves: this machine's CPU backend.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    /// ggml's description of the CPU.
    pub description: String,
    /// Memory free, in bytes (what clients size their split from).
    pub free_bytes: u64,
    /// Memory in all, in bytes.
    pub total_bytes: u64,
}

/// The CPU device ggml would serve.
fn cpu_device() -> Result<sys::ggml_backend_dev_t, String> {
    super::init();
    // SAFETY: a lookup in ggml's registry of built-in backends.
    let dev = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if dev.is_null() { Err("llama.cpp was built without a CPU backend".into()) } else { Ok(dev) }
}

/// Describes the CPU backend a server started here would offer.
pub fn local_backend() -> Result<LocalBackend, String> {
    let dev = cpu_device()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: dev is a live device; the outputs are plain integers.
    unsafe { sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
    // SAFETY: a NUL-terminated description owned by the device.
    let description = unsafe { CStr::from_ptr(sys::ggml_backend_dev_description(dev)) }.to_string_lossy().into_owned();
    Ok(LocalBackend { description, free_bytes: free as u64, total_bytes: total as u64 })
}

/// Binds `host:port` the way ggml's server will (address reuse on) and lets
/// it go, without listening: a listener here, even for a moment, would
/// take a client's connection and then reset it when dropped.
fn check_port_free(host: &str, port: u16) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let mut last = None;
    for addr in (host, port).to_socket_addrs()? {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        match socket.bind(&addr.into()) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the host has no address")))
}

/// Serves this machine's CPU backend at `host:port` with `threads` compute
/// threads, until the process is stopped. `cache_dir` lets the server keep
/// large tensors a client uploads, by hash, so a reconnecting client sends
/// only their hashes. Returns only on failure.
pub fn serve(host: &str, port: u16, threads: usize, cache_dir: Option<&Path>) -> Result<(), String> {
    let dev = cpu_device()?;
    // ggml reports a port it cannot bind only on stdout, then returns:
    // bind once here so that error is ours and clear.
    check_port_free(host, port).map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let endpoint = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let endpoint = CString::new(endpoint).map_err(|_| "the host contains a NUL byte".to_string())?;
    let cache = match cache_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("cache directory {}: {e}", d.display()))?;
            Some(
                CString::new(d.as_os_str().as_encoded_bytes())
                    .map_err(|_| "the cache directory's path contains a NUL byte".to_string())?,
            )
        }
        None => None,
    };
    let mut devices = [dev];
    // SAFETY: the strings and the device array outlive the call, which
    // serves clients in this thread until the process ends.
    unsafe {
        ggml_backend_rpc_start_server(
            endpoint.as_ptr(),
            cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            threads.max(1),
            devices.len(),
            devices.as_mut_ptr(),
        )
    };
    Err("the RPC server stopped (see llama.cpp's message above)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn endpoints_parse_or_say_why() {
        assert_eq!(parse_endpoint("127.0.0.1:50052").unwrap(), ("127.0.0.1".into(), 50052));
        assert_eq!(parse_endpoint("[::1]:7").unwrap(), ("::1".into(), 7));
        assert_eq!(parse_endpoint("box.lan:1").unwrap(), ("box.lan".into(), 1));
        for bad in ["127.0.0.1", ":50052", "h:port", "h:70000"] {
            let e = parse_endpoint(bad).unwrap_err();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn socket_table_addresses_read_back() {
        let v4 = parse_proc_addr("0100007F:C350").unwrap();
        assert_eq!(v4, "127.0.0.1:50000".parse().unwrap());
        let v6 = parse_proc_addr("00000000000000000000000001000000:0035").unwrap();
        assert_eq!(v6, "[::1]:53".parse().unwrap());
        assert_eq!(parse_proc_addr("zz:1"), None);
    }

    #[test]
    fn what_a_wrong_service_sent_is_shown_as_text_or_else_in_hex() {
        let text = not_rpc("h:1", b"HTTP/1.1 400 Bad Request\r\nServer: x");
        assert!(text.contains("(it sent `HTTP/1.1 400 Bad Request`)"), "{text}");
        let binary = not_rpc("h:1", &[14, 24, 0, 0, 0, 0, 0, 0]);
        assert!(binary.contains("(it sent `0e 18 00 00 00 00 00 00`)"), "{binary}");
    }

    #[test]
    fn a_server_that_ends_is_seen_by_the_watch_and_in_the_socket_table() {
        let _one = WATCHING.lock().unwrap_or_else(|p| p.into_inner());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        let watch = ConnectionWatch::new(addr);
        assert_eq!(watch.connections(), 1, "the client's socket, not the listener's or the accepted one");
        assert!(!watch.closed() && !connection_lost(addr), "an open connection is not lost");
        drop(server_side);
        drop(listener);
        // The FIN arrives asynchronously: wait until the peek sees it (which
        // the socket table confirms inside `closed`).
        let t0 = std::time::Instant::now();
        while !watch.closed() {
            assert!(t0.elapsed() < Duration::from_secs(60), "the peek never saw the end of the stream");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(connection_lost(addr));
        drop(client);
    }

    /// A listener on a free port whose one connection `answer` handles.
    fn fake_server(answer: impl FnOnce(TcpStream) + Send + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            answer(stream);
        });
        endpoint
    }

    #[test]
    fn a_server_of_another_protocol_or_no_server_at_all_is_named() {
        use std::io::{Read, Write};
        let old = fake_server(|mut s| {
            let mut hello = [0u8; 1 + 8 + CONN_CAPS];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(hello[0], CMD_HELLO);
            let mut answer = (4 + CONN_CAPS as u64).to_le_bytes().to_vec();
            answer.extend_from_slice(&[6, 1, 0, 0]);
            answer.extend_from_slice(&[0; CONN_CAPS]);
            s.write_all(&answer).unwrap();
        });
        let e = connect(&old).unwrap_err();
        assert!(e.contains("speaks RPC protocol 6.1.0") && e.contains("same bmoe build"), "{e}");
        let web = fake_server(|mut s| {
            let mut hello = [0u8; 1 + 8 + CONN_CAPS];
            s.read_exact(&mut hello).unwrap();
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        });
        let e = connect(&web).unwrap_err();
        assert!(e.contains("did not answer the RPC greeting (it sent `HTTP/1.1 400 Bad Request`)"), "{e}");
        assert!(e.contains("not a `bmoe rpc-server`"), "{e}");
        let hangs_up = fake_server(drop);
        let e = connect(&hangs_up).unwrap_err();
        assert!(e.contains("closed the connection without answering"), "{e}");
    }

    /// A web server that, like most, answers only once a request's header
    /// lines have ended (here at most 30 s, then it hangs up).
    fn web_server() -> (String, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 256];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        });
        (endpoint, thread)
    }

    #[test]
    fn a_web_server_on_the_port_is_not_blamed_on_another_client() {
        let (web, thread) = web_server();
        let stream = TcpStream::connect(&web).unwrap();
        let e = greet(stream, &web, Duration::from_millis(300)).unwrap_err();
        assert!(!e.contains("another client"), "{e}");
        assert!(
            e.contains(&format!("{web} did not answer the RPC greeting (it sent `HTTP/1.1 400 Bad Request`)")),
            "{e}"
        );
        thread.join().unwrap();
        // A listener that never takes the connection (a server busy with
        // another client) is the busy case.
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = busy.local_addr().unwrap().to_string();
        let e = greet(TcpStream::connect(&endpoint).unwrap(), &endpoint, Duration::from_millis(300)).unwrap_err();
        assert!(
            e.contains("did not answer the RPC greeting") && e.contains("another client is probably using it"),
            "{e}"
        );
    }

    #[test]
    fn this_machines_addresses_leave_out_loopback_and_can_be_bound() {
        let found = local_addresses();
        for ip in &found {
            assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
            // Each is this machine's own: binding it (port 0, no traffic) works.
            TcpListener::bind((*ip, 0)).unwrap_or_else(|e| panic!("{ip} is not this machine's: {e}"));
        }
        let mut unique = found.clone();
        unique.dedup();
        assert_eq!(unique.len(), found.len());
    }

    /// The tests that watch connections, one at a time: the abort note
    /// reads every server of the process.
    static WATCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_abort_note_names_the_server_whose_connection_ended() {
        let _one = WATCHING.lock().unwrap_or_else(|p| p.into_inner());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        remember_name(addr, "gpu-box:50052");
        let client = TcpStream::connect(addr).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        let watch = ConnectionWatch::new(addr);
        let note = abort_note();
        assert!(note.contains("the RPC server at gpu-box:50052 stopped answering: "), "the one server in use: {note}");
        drop(server_side);
        drop(listener);
        let t0 = std::time::Instant::now();
        while !abort_note().contains("the RPC server at gpu-box:50052 stopped answering (its connection") {
            assert!(t0.elapsed() < Duration::from_secs(60), "never named: {}", abort_note());
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(watch);
        drop(client);
    }

    #[test]
    fn an_unreachable_server_is_an_error_not_an_abort() {
        // A port nothing listens on: bind one, then free it.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = connect(&format!("127.0.0.1:{port}")).unwrap_err();
        assert!(e.contains("cannot reach the RPC server") && e.contains("bmoe rpc-server"), "{e}");
    }
}
