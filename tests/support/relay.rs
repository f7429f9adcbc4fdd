//! A TCP relay in front of a Redis the test controls: a network between
//! the limiter and Redis that can be cut, held and healed while Redis
//! keeps running.
//!
//! - [`Relay::cut`]: every connection is closed (RST to Redis, FIN to the
//!   client once it has its answers) and new ones are refused until
//!   [`Relay::heal`]. Commands the relay holds but
//!   has not forwarded are lost, as in a real cut. The relay first stops
//!   forwarding commands and lets the answers already on their way
//!   through (Redis has answered a PING of its own, and then no answer
//!   has come for [`QUIET`]; at most [`DRAIN`]), so
//!   no command Redis has run loses its answer in the cut: what a test
//!   counts afterwards is exactly what the instances were answered. (An
//!   answer lost in a cut is an outcome the limiter cannot know;
//!   docs/accuracy.md bounds it.)
//! - [`Relay::hold`]: nothing is forwarded either way, connections stay
//!   open, and what was sent meanwhile is delivered at
//!   [`Relay::release`]: a partition that TCP's retransmissions outlive,
//!   the late delivery a timeout does not cancel.
//! - [`Relay::hold_answers`]: commands reach Redis, which runs them; their
//!   answers wait until [`Relay::release`]: the one window a "not after"
//!   bound leaves, a check charged in time whose caller stopped waiting.
//!
//! The relay runs on a thread of its own, so a busy test runtime does not
//! slow the network down.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The longest a cut lets answers already under way reach the client
/// before it resets the connections.
pub const DRAIN: Duration = Duration::from_secs(2);
/// A cut resets the connections once no answer has come for this long.
pub const QUIET: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Bytes flow both ways.
    Open,
    /// Commands (client → Redis) stop; answers still flow.
    Draining,
    /// Nothing flows; delivered later.
    Held,
    /// Commands flow; answers are delivered later.
    AnswersHeld,
    /// Connections are reset; new ones refused.
    Cut,
}

pub struct Relay {
    pub port: u16,
    /// Redis's port.
    target: u16,
    mode: watch::Sender<Mode>,
    /// Connections accepted so far.
    accepted: Arc<Mutex<u64>>,
    /// When an answer was last forwarded.
    answered: Arc<Mutex<std::time::Instant>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// A relay on a free loopback port in front of `127.0.0.1:target`.
    pub fn start(target: u16) -> Self {
        Self::with_latency(target, Duration::ZERO)
    }

    /// The same, each command held `latency` before it is forwarded: a
    /// round trip that long, as between regions.
    pub fn with_latency(target: u16, latency: Duration) -> Self {
        let port = super::free_port();
        let (mode, watch_rx) = watch::channel(Mode::Open);
        let accepted = Arc::new(Mutex::new(0));
        let answered = Arc::new(Mutex::new(std::time::Instant::now()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let count = Arc::clone(&accepted);
        let last = Arc::clone(&answered);
        let thread = std::thread::Builder::new()
            .name(format!("relay-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    tokio::select! {
                        () = serve(port, target, latency, watch_rx, count, last, ready_tx) => {}
                        _ = stopped => {}
                    }
                });
            })
            .unwrap();
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("relay listening");
        Self {
            port,
            target,
            mode,
            accepted,
            answered,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Resets every connection and refuses new ones, after letting the
    /// answers under way through (see the module's guide).
    pub fn cut(&self) {
        self.mode.send_replace(Mode::Draining);
        let began = std::time::Instant::now();
        // A write to Redis under way when forwarding stopped ends first.
        std::thread::sleep(Duration::from_millis(5));
        // Redis answers a PING of its own connection once it has run what
        // it read before: its answers to the relay are written by then.
        self.ping_target();
        *self.answered.lock().unwrap() = std::time::Instant::now();
        // Bounded by DRAIN.
        while began.elapsed() < DRAIN && self.answered.lock().unwrap().elapsed() < QUIET {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.mode.send_replace(Mode::Cut);
    }

    /// A PING to Redis itself (not through the relay), answered or not
    /// within [`DRAIN`].
    fn ping_target(&self) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.target)) else {
            return;
        };
        let _ = s.set_read_timeout(Some(DRAIN));
        let mut pong = [0u8; 7];
        if s.write_all(b"PING\r\n").is_ok() {
            let _ = s.read_exact(&mut pong);
        }
    }

    /// Forwards nothing, keeps the connections; [`release`](Self::release)
    /// delivers what was sent meanwhile.
    pub fn hold(&self) {
        self.mode.send_replace(Mode::Held);
    }

    /// Forwards commands, holds their answers; [`release`](Self::release)
    /// delivers them.
    pub fn hold_answers(&self) {
        self.mode.send_replace(Mode::AnswersHeld);
    }

    /// Ends a [`hold`](Self::hold) or a [`hold_answers`](Self::hold_answers).
    pub fn release(&self) {
        self.mode.send_replace(Mode::Open);
    }

    /// Ends a [`cut`](Self::cut): connections are accepted again.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Open);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        *self.accepted.lock().unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    port: u16,
    target: u16,
    latency: Duration,
    mut mode: watch::Receiver<Mode>,
    accepted: Arc<Mutex<u64>>,
    answered: Arc<Mutex<std::time::Instant>>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut ready = Some(ready);
    // Bounded: the loop ends with the relay (the select in `start`).
    loop {
        // While cut, no listener: connections are refused.
        if *mode.borrow_and_update() == Mode::Cut {
            let _ = mode.changed().await;
            continue;
        }
        // std sets SO_REUSEADDR on Unix, so the port is ours again at once.
        let listener = match TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        loop {
            tokio::select! {
                accepted_conn = listener.accept() => {
                    let Ok((client, _)) = accepted_conn else { continue };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        drop(client);
                        continue;
                    };
                    *accepted.lock().unwrap() += 1;
                    tokio::spawn(pipe(client, server, latency, mode.clone(), Arc::clone(&answered)));
                }
                changed = mode.changed() => {
                    if changed.is_err() || *mode.borrow() == Mode::Cut {
                        break;
                    }
                }
            }
        }
        drop(listener);
    }
}

/// One connection both ways, obeying the relay's mode.
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    latency: Duration,
    mode: watch::Receiver<Mode>,
    answered: Arc<Mutex<std::time::Instant>>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Redis's side is closed with RST: what it had not answered is gone.
    // The client's with FIN: an RST would also throw away answers it
    // received but had not read yet (the kernel discards them), which a
    // cut after the drain must not lose.
    let _ = server.set_zero_linger();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = copy(cr, sw, latency, mode.clone(), None);
    let down = copy(sr, cw, Duration::ZERO, mode.clone(), Some(answered));
    let _ = tokio::join!(up, down);
}

/// Copies one direction: answers (Redis → client) when `answered` is
/// given, which it sets at each forward; else commands. On a cut it
/// returns, and the sockets (zero linger) are reset once both directions
/// have.
async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: Duration,
    mut mode: watch::Receiver<Mode>,
    answered: Option<Arc<Mutex<std::time::Instant>>>,
) {
    let commands = answered.is_none();
    let mut buf = vec![0u8; 16 * 1024];
    let flows = |m: Mode| match m {
        Mode::Open => true,
        Mode::Draining => !commands,
        Mode::AnswersHeld => commands,
        Mode::Held | Mode::Cut => false,
    };
    loop {
        let m = *mode.borrow_and_update();
        if m == Mode::Cut {
            break;
        }
        if !flows(m) {
            if mode.changed().await.is_err() {
                break;
            }
            continue;
        }
        tokio::select! {
            n = from.read(&mut buf) => {
                let n = match n { Ok(0) | Err(_) => break, Ok(n) => n };
                // Read before a hold began: delivered when it ends (a cut
                // drops it).
                loop {
                    let m = *mode.borrow_and_update();
                    if m == Mode::Cut { return }
                    if flows(m) { break }
                    if mode.changed().await.is_err() { return }
                }
                if !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                if let Some(at) = &answered {
                    *at.lock().unwrap() = std::time::Instant::now();
                }
            }
            changed = mode.changed() => {
                if changed.is_err() { break }
            }
        }
    }
}
