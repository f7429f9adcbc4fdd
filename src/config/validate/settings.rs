//! The settings of a configuration beside its limits and routes, checked:
//! the key secret, the client address rules, plan assignments, custom key
//! names, `[escalation]` and the `401`'s challenge; and, when a layer is
//! made or reloaded, custom keys against the extractors it has.

use super::{Place, Validator};
use crate::config::sections::Keys;
use crate::config::{Config, ConfigError, Hidden};
use crate::key::{KeySecret, MIN_SECRET_BYTES, SecretOrigin, check_custom_name};

/// The most requests `delay` may hold at once per instance (each is a
/// parked request and its connection).
const MAX_DELAYED: usize = 1_000_000;

/// The challenge of a missing key's `401` when none is configured.
const DEFAULT_WWW_AUTHENTICATE: &str = "ApiKey";

impl Validator<'_> {
    /// The key secret, from code or from the environment (`secret_env`);
    /// unset, the built-in one of `prefix`.
    pub(in crate::config) fn key_secret(
        &self,
        keys: &Keys,
        prefix: &str,
    ) -> Result<KeySecret, ConfigError> {
        Ok(match (&keys.secret, &keys.secret_env) {
            (Some(Hidden(s)), _) => {
                check_secret_len(s.len()).map_err(ConfigError::new)?;
                KeySecret::new(s, SecretOrigin::Code)
            }
            (None, Some(name)) => {
                let at = Place::of(&["keys", "secret_env"]);
                let secret = secret_from_env(name).map_err(|e| self.err(at, e))?;
                KeySecret::new(secret.as_bytes(), SecretOrigin::Env(name.clone()))
            }
            (None, None) => KeySecret::default_for(prefix),
        })
    }

    pub(in crate::config) fn ipv6_prefix(&self, bits: u8) -> Result<(), ConfigError> {
        if bits > 128 {
            let at = Place::of(&["client_ip", "ipv6_prefix"]);
            return Err(self.err(at, "ipv6_prefix must be between 0 and 128"));
        }
        Ok(())
    }

    /// Limit `limit`'s `custom:<name>` key.
    pub(in crate::config) fn custom_key_name(
        &self,
        limit: &str,
        name: &str,
        at: Place,
    ) -> Result<(), ConfigError> {
        check_custom_name(name).map_err(|e| self.err(at, format!("limit {limit:?}: {e}")))
    }

    /// A plan callers are assigned to: one of the plans defined. Call after
    /// every plan is in.
    pub(in crate::config) fn assigned_plan(
        &self,
        plan: &str,
        at: Place,
    ) -> Result<(), ConfigError> {
        if !self.plans.contains(plan) {
            let mut known: Vec<&String> = self.plans.iter().collect();
            known.sort();
            return Err(self.err(
                at,
                format!("unknown plan {plan:?} (defined under [plans]: {known:?})"),
            ));
        }
        Ok(())
    }

    /// `[escalation] max_delayed`: 1 to [`MAX_DELAYED`].
    pub(in crate::config) fn max_delayed(&self, n: usize) -> Result<usize, ConfigError> {
        let at = Place::of(&["escalation", "max_delayed"]);
        self.at_least_one("[escalation] max_delayed", n, at.clone())?;
        if n > MAX_DELAYED {
            return Err(self.err(
                at,
                format!("[escalation] max_delayed must be at most {MAX_DELAYED}"),
            ));
        }
        Ok(n)
    }

    /// The `WWW-Authenticate` challenge of a missing key's `401`.
    pub(in crate::config) fn www_authenticate(
        &self,
        challenge: Option<&str>,
    ) -> Result<http::HeaderValue, ConfigError> {
        let at = Place::of(&["keys", "www_authenticate"]);
        match challenge {
            Some(c) => self::challenge(c).map_err(|e| self.err(at, e)),
            None => Ok(http::HeaderValue::from_static(DEFAULT_WWW_AUTHENTICATE)),
        }
    }
}

impl Config {
    /// Every limit keyed by a custom key has its extractor among
    /// `registered`; else the error names the limit, the key, and where it
    /// was written.
    /// A global limit (`scope = "global"`) needs the configuration's own
    /// Redis: its quotas are read from it and exchanged through it, which
    /// a layer on another store (in-process, or one of the user's) cannot.
    pub(crate) fn check_global_store(&self, own_redis: bool) -> Result<(), ConfigError> {
        let Some(l) = self.limits.iter().find(|l| l.global.is_some()) else {
            return Ok(());
        };
        if own_redis {
            return Ok(());
        }
        let mut e = ConfigError::new(format!(
            "limit {:?} is global (scope = \"global\"): it is decided on the configuration's \
             own Redis, which this layer does not use (in_memory, with_store, a store given \
             to the builder, or without_redis); build it with RateLimitLayer::new",
            l.name
        ));
        if let Some(f) = &self.file {
            e = e.in_file(f);
        }
        Err(e)
    }

    pub(crate) fn check_custom_keys(
        &self,
        registered: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        for l in &self.limits {
            let crate::key::KeySource::Custom(name) = &l.key else {
                continue;
            };
            if registered(name) {
                continue;
            }
            let at = self.custom_key_at.get(&l.name).copied().flatten();
            let mut e = ConfigError::placed(
                at,
                format!(
                    "limit {:?} is keyed by custom key {name:?}, but no extractor of that name \
                     was registered: add `.key_fn({name:?}, ..)` to the layer's builder",
                    l.name
                ),
            );
            if let Some(f) = &self.file {
                e = e.in_file(f);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// A `WWW-Authenticate` challenge (RFC 9110 §11.6.1): an auth-scheme (a
/// token), then optionally a space and its parameters, all visible ASCII.
fn challenge(c: &str) -> Result<http::HeaderValue, String> {
    let scheme = c.split(' ').next().unwrap_or("");
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if scheme.is_empty() || !scheme.bytes().all(tchar) {
        return Err(format!(
            "www_authenticate {c:?} must start with an auth-scheme (letters, digits, \
             '-', '.', ...), e.g. \"ApiKey\" or \"Bearer realm=\\\"api\\\"\""
        ));
    }
    if c.len() > 1024 || !c.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) || c.ends_with(' ') {
        return Err(format!(
            "www_authenticate {c:?} must be at most 1024 characters of visible ASCII and single spaces"
        ));
    }
    http::HeaderValue::from_str(c).map_err(|e| format!("www_authenticate {c:?}: {e}"))
}

/// The key secret from environment variable `name`, checked.
fn secret_from_env(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("secret_env must name an environment variable".into());
    }
    let secret = match std::env::var(name) {
        Ok(s) if !s.is_empty() => s,
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            return Err(format!(
                "environment variable {name} (keys.secret_env) is not set; it holds the secret \
                 API keys are hashed with in Redis key names, and every instance and the \
                 fleetlimit CLI need the same value"
            ));
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(format!(
                "environment variable {name} (keys.secret_env) is not valid UTF-8"
            ));
        }
    };
    check_secret_len(secret.len()).map_err(|e| format!("environment variable {name}: {e}"))?;
    Ok(secret)
}

/// A key secret must be long enough not to be guessed.
fn check_secret_len(len: usize) -> Result<(), String> {
    if len < MIN_SECRET_BYTES {
        return Err(format!(
            "the key secret is {len} bytes; it must be at least {MIN_SECRET_BYTES} \
             (for example `openssl rand -hex 32`)"
        ));
    }
    Ok(())
}
