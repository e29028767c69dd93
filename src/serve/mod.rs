//! `bmoe serve`: an OpenAI-compatible HTTP server in front of the session
//! host. The engine keeps its own thread ([`engine`]) and the HTTP side
//! (axum on tokio, [`routes`]) talks to it over channels, as `bmoe chat`'s
//! worker does. Endpoints: OpenAI's `/v1/chat/completions`,
//! `/v1/completions`, `/v1/responses` ([`responses`]) and `/v1/models`,
//! Anthropic's `/v1/messages` ([`anthropic`]), Ollama's `/api/...`
//! ([`ollama`]), `/health`, `/metrics`, and a chat page at `/`.

mod anthropic;
mod deltas;
mod engine;
mod error;
mod logprobs;
mod metrics;
mod ollama;
mod pace;
mod parse_errors;
mod placement;
mod reply;
mod request;
mod responses;
mod routes;
mod slots;

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;

pub use engine::{Engine, Status};
pub use error::ApiError;

use crate::config::RunConfig;
use crate::host::Host;
use parse_errors::ErrorBodies;

/// The chat page served at `/`: one file, nothing fetched from elsewhere.
const PAGE: &str = include_str!("page.html");

/// How long a connection may take to send a request's headers (a client
/// that connects and sends nothing is dropped after this).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections the kernel may hold for the server before it accepts them.
/// The standard library's 128 fills within a burst of connects, and each
/// connection dropped then costs its client a one-second SYN retry; the
/// kernel caps this at `net.core.somaxconn` (4096 on current Linux).
const LISTEN_BACKLOG: u32 = 1024;

/// Where and how the server listens.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// The key clients must send, if any.
    pub api_key: Option<String>,
    /// Requests that may wait for the model.
    pub queue: usize,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Requests decoded together.
    pub parallel: usize,
    /// The token limit of a request that sets none (`None`: the room left
    /// in the context).
    pub default_max_tokens: Option<u32>,
    /// Origins browser apps may call the API from (CORS).
    pub cors: routes::Cors,
}

impl ServeOptions {
    /// The options `config`'s `[serve]` table gives; an address that does
    /// not parse is an error naming it.
    pub fn from_config(config: &RunConfig) -> Result<ServeOptions, String> {
        let s = &config.serve;
        let ip: std::net::IpAddr = s
            .host
            .parse()
            .map_err(|_| format!("serve.host: `{}` is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)", s.host))?;
        let key = Some(s.api_key.clone()).filter(|k| !k.is_empty()).or_else(|| std::env::var("BMOE_API_KEY").ok());
        Ok(ServeOptions {
            addr: SocketAddr::new(ip, s.port),
            api_key: key.filter(|k| !k.is_empty()),
            queue: s.queue as usize,
            body_limit: s.body_mb as usize * 1024 * 1024,
            parallel: s.parallel.max(1) as usize,
            default_max_tokens: None,
            cors: routes::Cors::parse(&s.cors)?,
        })
    }
}

/// A running server: the address it listens on and the engine behind it.
pub struct Server {
    /// The address bound (its port is the real one when 0 was asked).
    pub addr: SocketAddr,
    /// The engine thread's side.
    pub engine: std::sync::Arc<Engine>,
    listener: tokio::net::TcpListener,
    router: axum::Router,
}

impl Server {
    /// Binds `options.addr` and starts the engine thread, which opens the
    /// model with `open` (the server answers 503 until it has) for
    /// `options.parallel` sequences.
    pub fn bind(
        runtime: &tokio::runtime::Runtime,
        options: &ServeOptions,
        config: RunConfig,
        open: impl FnOnce() -> Result<Host, String> + Send + 'static,
    ) -> Result<Server, String> {
        let listener = runtime
            .block_on(async { listen(options.addr) })
            .map_err(|e| format!("listening on {}: {e}", options.addr))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let engine = Engine::start(config, options, open).map_err(|e| format!("starting the engine: {e}"))?;
        let state = routes::AppState {
            engine: engine.clone(),
            api_key: options.api_key.clone(),
            body_limit: options.body_limit,
        };
        Ok(Server { addr, engine, listener, router: routes::router(state, &options.cors) })
    }

    /// Answers connections until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let Server { listener, router, .. } = self;
        let open = std::sync::Arc::new(Connections::default());
        tokio::spawn(open.clone().give_back_memory());
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: wait, then go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let service = TowerToHyperService::new(router.clone());
            let guard = open.opened();
            tokio::spawn(async move {
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
                let _ = http.serve_connection(TokioIo::new(ErrorBodies::new(stream)), service).await;
                drop(guard);
            });
        }
    }
}

/// A listening socket on `addr` with [`LISTEN_BACKLOG`] (and, as the
/// standard library sets it, `SO_REUSEADDR`, so a restarted server binds
/// its port while the last one's connections linger in TIME_WAIT).
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The open connections, to hand memory back once a flood of them ends.
#[derive(Default)]
struct Connections {
    open: std::sync::atomic::AtomicUsize,
    /// Connections opened since memory was last handed back.
    since_trim: std::sync::atomic::AtomicUsize,
}

/// One open connection; closed when dropped.
struct Open(std::sync::Arc<Connections>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Connections {
    fn opened(self: &std::sync::Arc<Self>) -> Open {
        self.open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.since_trim.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Open(self.clone())
    }

    /// Every second: once a burst of connections (64 or more since the
    /// last time) is over, hands the allocator's free memory back to the
    /// system; and once more when the connections still open then have
    /// closed too (on a loaded machine the last of a burst close late).
    /// (glibc keeps what thousands of connections' buffers freed in its
    /// arenas: RSS stayed at its peak after a flood of idle connections.)
    async fn give_back_memory(self: std::sync::Arc<Self>) {
        use std::sync::atomic::Ordering;
        // Connections open at the last trim, still to be given back.
        let mut left = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let open = self.open.load(Ordering::Relaxed);
            let burst = self.since_trim.load(Ordering::Relaxed) >= 64;
            if open <= 16 && (burst || (left > 0 && open < left)) {
                self.since_trim.store(0, Ordering::Relaxed);
                crate::llama::memory::trim_heap();
                left = open;
            }
        }
    }
}

/// Whether clients beyond this machine can reach `addr`.
pub fn is_exposed(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET`/`POST` on `url`: the status and the body's JSON.
    fn call(url: &str, post: Option<&str>) -> (u16, serde_json::Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut r = match post {
            Some(body) => agent.post(url).header("Content-Type", "application/json").send(body),
            None => agent.get(url).call(),
        }
        .expect("an answer");
        (r.status().as_u16(), r.body_mut().read_json().unwrap_or_default())
    }

    /// A burst of connections waits in the kernel's queue, none dropped,
    /// while the server has not accepted them yet (with the standard
    /// library's backlog of 128, the 130th connect's SYN is dropped and the
    /// connect never completes while nothing is accepted).
    #[test]
    fn a_burst_of_connections_waits_in_the_listen_queue() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        let listener = runtime.block_on(async { listen("127.0.0.1:0".parse().unwrap()) }).unwrap();
        let addr = listener.local_addr().unwrap();
        // The kernel caps a backlog at net.core.somaxconn (128 before Linux 5.4).
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(LISTEN_BACKLOG as usize);
        // 384 connections where the kernel allows a backlog of 1,024: three
        // times what the standard library's backlog holds.
        let burst = (cap.min(1024) * 3 / 8).max(1);
        let timeout = std::time::Duration::from_secs(20);
        let open: Vec<std::net::TcpStream> = (0..burst)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, timeout)
                    .unwrap_or_else(|e| panic!("connection {} of {burst} was not queued: {e}", i + 1))
            })
            .collect();
        assert_eq!(open.len(), burst);
    }

    #[test]
    fn the_server_answers_503_while_the_model_loads_and_after_it_failed() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (release, opened) = std::sync::mpsc::channel::<()>();
        let mut config = RunConfig::default();
        config.serve.port = 0;
        let options = ServeOptions::from_config(&config).unwrap();
        let server = Server::bind(&runtime, &options, config, move || {
            let _ = opened.recv();
            Err("the model file is gone".to_string())
        })
        .unwrap();
        let url = format!("http://{}", server.addr);
        let engine = server.engine.clone();
        runtime.spawn(server.run(std::future::pending()));
        let (status, body) = call(&format!("{url}/health"), None);
        assert_eq!((status, body["status"].as_str()), (503, Some("loading model")));
        let (status, body) = call(&format!("{url}/v1/chat/completions"), Some(r#"{"messages": []}"#));
        assert_eq!(status, 503);
        assert!(body["error"]["message"].as_str().unwrap().contains("loading"), "{body}");
        release.send(()).unwrap();
        while engine.status() == Status::Loading {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (status, body) = call(&format!("{url}/v1/models"), None);
        assert_eq!(status, 503);
        assert!(body["error"]["message"].as_str().unwrap().contains("the model file is gone"), "{body}");
        assert_eq!(call(&format!("{url}/health"), None).0, 503);
        runtime.shutdown_background();
    }
}
