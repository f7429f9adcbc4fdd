//! Resets reach every instance: `fleetlimit reset` (or
//! [`Admin::reset`](crate::admin::Admin::reset)) deletes a caller's Redis keys and
//! then announces those keys on the prefix's pub/sub channel
//! (`<prefix>:reset`). Every layer instance on Redis listens there with a
//! connection of its own and forgets the keys in its refused-key cache and
//! its token leases, so the next request goes to Redis and sees a full
//! bucket.
//!
//! An announcement is the exact Redis keys, one a line. Plain `PUBLISH` and
//! `SUBSCRIBE` on every topology: a cluster forwards a plain publish to every
//! node, so a listener may subscribe on any of them; resets are rare, so the
//! cluster-wide fan-out costs nothing that matters (sharded pub/sub would
//! tie every listener to the one primary owning the channel's slot).
//!
//! Pub/sub does not queue: an announcement made while a listener is not
//! connected is lost to it. So whenever a listener (re)subscribes it forgets
//! every remembered refusal and lease; those are only shortcuts, and Redis
//! answers the next request for each key. Until it listens again an instance
//! keeps answering from memory, at most until each refusal's `Retry-After`
//! (leases lapse within a second anyway).

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Weak;
use std::task::Poll;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::ReconnectPolicy;
use fred::types::{Builder, Message};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{oneshot, watch};

use crate::config::RedisSettings;
use crate::reload::Live;
use crate::store::StoreError;

/// The largest announcement published or accepted: a reset names one key
/// per limit, far below this; anything bigger is not ours.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;

/// The longest key accepted in an announcement (keys are at most a few
/// hundred bytes: prefix, limit name, tag and a 64-byte value or digest).
const MAX_KEY: usize = 1024;

/// The channel resets of keys under `prefix` are announced on. A channel is
/// not a key: no key of the prefix can collide with it.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:reset")
}

/// `keys` as announcements, each at most [`MAX_MESSAGE`] bytes (a key too
/// long to announce is left out: it could not be a limiter key).
pub(crate) fn messages(keys: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for k in keys.iter().filter(|k| is_key(k.as_bytes())) {
        if !cur.is_empty() && cur.len() + 1 + k.len() > MAX_MESSAGE {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push('\n');
        }
        cur.push_str(k);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn is_key(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= MAX_KEY && k.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The keys of an announcement for `prefix`, or `None` when it is not one:
/// too big, empty, a line that is empty, not printable ASCII without
/// spaces, too long, or not under the prefix.
pub(crate) fn parse<'a>(prefix: &str, message: &'a [u8]) -> Option<Vec<&'a str>> {
    if message.is_empty() || message.len() > MAX_MESSAGE {
        return None;
    }
    let text = std::str::from_utf8(message).ok()?;
    let mut keys = Vec::new();
    for k in text.split('\n') {
        let ours = k
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(':'));
        if !is_key(k.as_bytes()) || !ours {
            return None;
        }
        keys.push(k);
    }
    Some(keys)
}

/// A client for listening, built like the store's pool (the same URL,
/// TLS and credentials): it reconnects forever (the same policy as the
/// pool's) and waits for Redis if it is down.
fn listener_client(settings: &RedisSettings) -> Result<Client, StoreError> {
    let (mut config, _tls) = crate::store::redis::connect::fred_config(settings)?;
    config.fail_fast = false;
    let connect_timeout = settings.connect_timeout;
    Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = connect_timeout;
            c.internal_command_timeout = connect_timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 20, 1_000, 2))
        .build()
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// Starts the listener of `layer`, which reaches the caches of whatever
/// configuration the layer runs; it ends when `stop` closes (the layer was
/// dropped). The returned receiver
/// fires once the first subscription is in place and the caches were
/// cleared after it.
pub(crate) fn start(
    settings: &RedisSettings,
    prefix: &str,
    layer: Weak<Live>,
    stop: watch::Receiver<()>,
) -> Result<oneshot::Receiver<()>, StoreError> {
    let client = listener_client(settings)?;
    let (ready_tx, ready_rx) = oneshot::channel();
    let listener = Listener {
        client,
        channel: channel(prefix),
        prefix: prefix.to_owned(),
        layer,
        stop,
    };
    tokio::spawn(listener.run(ready_tx));
    Ok(ready_rx)
}

struct Listener {
    client: Client,
    channel: String,
    prefix: String,
    layer: Weak<Live>,
    stop: watch::Receiver<()>,
}

enum Event {
    Stop,
    Message(Result<Message, RecvError>),
    Reconnected,
}

impl Listener {
    async fn run(mut self, ready: oneshot::Sender<()>) {
        let _connection = self.client.connect();
        if !self.until_connected().await {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.client.quit()).await;
            return;
        }
        // Created after the first connection: its event is not replayed;
        // every later one means a new connection without the subscription.
        let mut reconnects = self.client.reconnect_rx();
        let mut messages = self.client.message_rx();
        let mut ready = Some(ready);
        let mut subscribed = self.subscribe().await;
        if subscribed {
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
        }
        while subscribed {
            let event = {
                let stop = pin!(self.stop.changed());
                let message = pin!(messages.recv());
                let reconnect = pin!(reconnects.recv());
                select3(stop, message, reconnect).await
            };
            match event {
                Event::Stop => break,
                Event::Message(Ok(m)) => self.on_message(&m),
                Event::Message(Err(RecvError::Lagged(n))) => {
                    // Announcements were dropped unread: forget everything.
                    tracing::debug!(target: "fleetlimit", lost = n, "reset listener fell behind; forgetting remembered refusals and leases");
                    subscribed = self.forget_all();
                }
                Event::Message(Err(RecvError::Closed)) => break,
                Event::Reconnected => {
                    // One resubscription for a burst of reconnections (a
                    // cluster reconnects node by node).
                    while reconnects.try_recv().is_ok() {}
                    subscribed = self.subscribe().await;
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.quit()).await;
    }

    /// Waits for the first connection (Redis may be down at start). `false`
    /// when stopped meanwhile.
    async fn until_connected(&mut self) -> bool {
        // Each failed attempt is spaced by the reconnect policy; the pause
        // only guards against a client that reports failures back to back.
        loop {
            let connected = {
                let stop = pin!(self.stop.changed());
                let connect = pin!(self.client.wait_for_connect());
                select2(stop, connect).await
            };
            match connected {
                None => return false,
                Some(Ok(())) => return true,
                Some(Err(e)) => {
                    tracing::debug!(target: "fleetlimit", error = %e, "reset listener: Redis not reachable yet");
                    if !self.pause(Duration::from_millis(100)).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Subscribes (again), then forgets what may have been announced while
    /// not subscribed. Retries until it works; `false` when stopped.
    async fn subscribe(&mut self) -> bool {
        let mut wait = Duration::from_millis(50);
        loop {
            let done = {
                let stop = pin!(self.stop.changed());
                let sub = pin!(self.client.subscribe(self.channel.as_str()));
                select2(stop, sub).await
            };
            match done {
                None => return false,
                Some(Ok(())) => return self.forget_all(),
                Some(Err(e)) => {
                    tracing::debug!(target: "fleetlimit", error = %e, channel = %self.channel, "reset listener could not subscribe; retrying");
                    if !self.pause(wait).await {
                        return false;
                    }
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Forgets every remembered refusal and lease; `false` if the layer is
    /// gone.
    fn forget_all(&self) -> bool {
        match self.layer.upgrade() {
            Some(l) => {
                l.load().forget_all_cached();
                true
            }
            None => false,
        }
    }

    fn on_message(&self, m: &Message) {
        if *m.channel != *self.channel {
            return;
        }
        let bytes = m.value.as_bytes().unwrap_or_default();
        let Some(keys) = parse(&self.prefix, bytes) else {
            tracing::debug!(target: "fleetlimit", channel = %self.channel, bytes = bytes.len(), "ignored a malformed reset message");
            return;
        };
        if let Some(l) = self.layer.upgrade() {
            l.load().forget_reset(&keys);
            tracing::debug!(target: "fleetlimit", keys = keys.len(), "reset: forgot remembered refusals and leases");
        }
    }

    /// Sleeps `d`; `false` if stopped meanwhile.
    async fn pause(&mut self, d: Duration) -> bool {
        let stop = pin!(self.stop.changed());
        let sleep = pin!(tokio::time::sleep(d));
        select2(stop, sleep).await.is_some()
    }
}

/// `None` when `stop` finished first (the layer was dropped), else what
/// `other` gave.
async fn select2<S: Future, F: Future>(
    mut stop: std::pin::Pin<&mut S>,
    mut other: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        other.as_mut().poll(cx).map(Some)
    })
    .await
}

/// Whichever of the three is ready first (the stop signal first of all).
async fn select3<S, M, R, T>(
    mut stop: std::pin::Pin<&mut S>,
    mut message: std::pin::Pin<&mut M>,
    mut reconnect: std::pin::Pin<&mut R>,
) -> Event
where
    S: Future,
    M: Future<Output = Result<Message, RecvError>>,
    R: Future<Output = Result<T, RecvError>>,
{
    poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Stop);
        }
        if let Poll::Ready(m) = message.as_mut().poll(cx) {
            return Poll::Ready(Event::Message(m));
        }
        match reconnect.as_mut().poll(cx) {
            // A closed event stream means the client quit.
            Poll::Ready(Err(RecvError::Closed)) => Poll::Ready(Event::Stop),
            Poll::Ready(_) => Poll::Ready(Event::Reconnected),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_round_trip_and_split_by_size() {
        let keys: Vec<String> = (0..3).map(|i| format!("rl:l:{{a:{i}}}")).collect();
        let m = messages(&keys);
        assert_eq!(m.len(), 1);
        assert_eq!(
            parse("rl", m[0].as_bytes()).unwrap(),
            ["rl:l:{a:0}", "rl:l:{a:1}", "rl:l:{a:2}"]
        );
        let many: Vec<String> = (0..20_000).map(|i| format!("rl:l:{{a:{i}}}")).collect();
        let m = messages(&many);
        assert!(m.len() > 1);
        assert!(m.iter().all(|s| s.len() <= MAX_MESSAGE));
        let back: Vec<&str> = m
            .iter()
            .flat_map(|s| parse("rl", s.as_bytes()).unwrap())
            .collect();
        assert_eq!(back.len(), many.len());
    }

    #[test]
    fn anything_else_is_not_an_announcement() {
        for bad in [
            "",
            "rl:l:{a:1}\n",
            "rl:l:{a:1} x",
            "rlx:l:{a:1}",
            "other:l:{a:1}",
            "rl:l:{a:\u{1}}",
            "rl:l:{a:é}",
        ] {
            assert_eq!(parse("rl", bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse("rl", &[0xff, 0xfe]), None);
        let huge = format!("rl:l:{{a:{}}}", "x".repeat(MAX_KEY));
        assert_eq!(parse("rl", huge.as_bytes()), None);
    }
}
