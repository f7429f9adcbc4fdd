//! The exact reference: each algorithm on one clock in one process, in
//! plain f64 arithmetic on the timestamps the replay hands it. Written from
//! docs/algorithms.md, not from the crate's code, so a shared mistake would
//! have to be made twice.

/// One limit's numbers, as the configuration states them.
#[derive(Clone, Copy, Debug)]
pub enum Algo {
    /// GCRA: a full bucket holds `capacity`, refilled `refill` per second.
    Token { capacity: f64, refill: f64 },
    /// At most `limit` per `window` s, the window opening with the key's
    /// first admitted request.
    Fixed { limit: f64, window: f64 },
    /// Two fixed windows aligned to the clock's zero (the in-process
    /// store's start, Redis's Unix time), the previous one weighted by its
    /// overlap with the sliding window.
    Sliding { limit: f64, window: f64 },
}

/// Redis's doubles near 1.8e15 µs step by ¼ µs: both stores admit a cost
/// that fits within half a µs of refill (docs/algorithms.md).
const SLACK_US: f64 = 0.5;

#[derive(Clone, Debug)]
pub struct Reference {
    algo: Algo,
    /// Token: TAT in µs. Fixed: count and the window's end (s).
    /// Sliding: window index, its count, the previous window's count.
    a: f64,
    b: f64,
    c: f64,
}

impl Reference {
    pub fn new(algo: Algo) -> Self {
        Self {
            algo,
            a: f64::NEG_INFINITY,
            b: 0.0,
            c: 0.0,
        }
    }

    /// Whether `cost` fits at `t` (seconds on the store's clock).
    pub fn fits(&self, t: f64, cost: f64) -> bool {
        match self.algo {
            Algo::Token { capacity, refill } => {
                let per = 1e6 / refill;
                let now = t * 1e6;
                let tat = self.a.max(now);
                tat + cost * per - now <= capacity * per + SLACK_US
            }
            Algo::Fixed { limit, .. } => {
                let count = if self.b > t { self.a.max(0.0) } else { 0.0 };
                count + cost <= limit
            }
            Algo::Sliding { limit, window } => {
                let (curr, prev, elapsed) = self.windows(t, window);
                prev * (window - elapsed) / window + curr + cost <= limit
            }
        }
    }

    /// Charges `cost` at `t` (whether or not it fits: a replay may adopt
    /// the layer's admission).
    pub fn charge(&mut self, t: f64, cost: f64) {
        match self.algo {
            Algo::Token { refill, .. } => {
                let now = t * 1e6;
                self.a = self.a.max(now) + cost * 1e6 / refill;
            }
            Algo::Fixed { window, .. } => {
                if self.b <= t {
                    self.a = 0.0;
                    self.b = t + window;
                }
                self.a += cost;
            }
            Algo::Sliding { window, .. } => {
                let (curr, prev, _) = self.windows(t, window);
                self.a = (t / window).floor();
                self.b = curr + cost;
                self.c = prev;
            }
        }
    }

    /// A reset: the key forgets everything.
    pub fn reset(&mut self) {
        *self = Self::new(self.algo);
    }

    /// New numbers for the key (a plan change): what it spent carries
    /// over (a token bucket's TAT, the time owed; a window's counts).
    pub fn set_algo(&mut self, algo: Algo) {
        self.algo = algo;
    }

    /// Current count, previous count and time into the current window.
    fn windows(&self, t: f64, w: f64) -> (f64, f64, f64) {
        let idx = (t / w).floor();
        let (curr, prev) = if self.a == idx {
            (self.b, self.c)
        } else if self.a == idx - 1.0 {
            (0.0, self.b)
        } else {
            (0.0, 0.0)
        };
        (curr, prev, t - idx * w)
    }
}
