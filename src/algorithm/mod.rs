//! The arithmetic of each algorithm, shared by the in-process store and the
//! tests; `lua/` holds the same arithmetic for Redis.

pub(crate) mod token_bucket;
