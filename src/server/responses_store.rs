//! The responses `POST /v1/responses` keeps (`store`, on by default as at
//! OpenAI) for `GET`/`DELETE /v1/responses/{id}` and for a later request's
//! `previous_response_id`. In memory only, so a restart loses them all, and
//! bounded three ways: at most [`CAPACITY`] responses, at most
//! [`MAX_BYTES`] of them (each counted with its whole conversation), each
//! kept [`TTL`] after it was last stored or read; past a bound the least
//! recently used go first. The store belongs to the server's `AppState`,
//! behind its mutex; nothing here awaits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use serde_json::Value;

/// Most responses kept.
pub const CAPACITY: usize = 1024;
/// How long a response is kept after it was last stored or read.
pub const TTL: Duration = Duration::from_secs(60 * 60);
/// Most bytes kept (each response's JSON plus its conversation's).
pub const MAX_BYTES: usize = 256 << 20;

/// One kept response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The Response object, as `GET` returns it.
    pub response: Arc<Value>,
    /// The conversation a follow-up continues: chat messages (without the
    /// request's `instructions`, which OpenAI does not carry over), the
    /// reply included. Messages are shared with the responses that follow.
    pub conversation: Vec<Arc<Value>>,
}

impl Stored {
    fn bytes(&self) -> usize {
        let json = |v: &Value| serde_json::to_string(v).map_or(0, |s| s.len());
        json(&self.response) + self.conversation.iter().map(|m| json(m)).sum::<usize>()
    }
}

struct Entry {
    stored: Stored,
    bytes: usize,
    last_used: Instant,
}

/// Least recently used first.
pub struct ResponseStore {
    entries: IndexMap<String, Entry>,
    bytes: usize,
    capacity: usize,
    max_bytes: usize,
    ttl: Duration,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(CAPACITY, MAX_BYTES, TTL)
    }
}

impl ResponseStore {
    pub fn new(capacity: usize, max_bytes: usize, ttl: Duration) -> Self {
        ResponseStore {
            entries: IndexMap::new(),
            bytes: 0,
            capacity,
            max_bytes,
            ttl,
        }
    }

    /// Keeps `stored` under `id`, evicting what the bounds require; a
    /// response larger than the whole byte budget is not kept (false).
    pub fn insert(&mut self, id: String, stored: Stored, now: Instant) -> bool {
        self.expire(now);
        self.remove(&id);
        let bytes = stored.bytes();
        if bytes > self.max_bytes || self.capacity == 0 {
            return false;
        }
        while self.entries.len() >= self.capacity || self.bytes + bytes > self.max_bytes {
            let Some((_, old)) = self.entries.shift_remove_index(0) else {
                break;
            };
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        self.entries.insert(
            id,
            Entry {
                stored,
                bytes,
                last_used: now,
            },
        );
        true
    }

    /// The response kept under `id`, now the most recently used.
    pub fn get(&mut self, id: &str, now: Instant) -> Option<Stored> {
        self.expire(now);
        let (_, key, mut entry) = self.entries.shift_remove_full(id)?;
        entry.last_used = now;
        let stored = entry.stored.clone();
        self.entries.insert(key, entry);
        Some(stored)
    }

    /// Forgets `id`; false if it was not kept.
    pub fn remove(&mut self, id: &str) -> bool {
        match self.entries.shift_remove(id) {
            Some(old) => {
                self.bytes -= old.bytes;
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops what has not been used for the TTL: the least recently used
    /// come first, so the scan stops at the first still fresh.
    fn expire(&mut self, now: Instant) {
        while let Some((_, first)) = self.entries.first() {
            if now.saturating_duration_since(first.last_used) < self.ttl {
                break;
            }
            if let Some((_, old)) = self.entries.shift_remove_index(0) {
                self.bytes -= old.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(text: &str) -> Stored {
        Stored {
            response: Arc::new(json!({"id": text})),
            conversation: vec![Arc::new(json!({"role": "user", "content": text}))],
        }
    }

    #[test]
    fn least_recently_used_goes_first() {
        let t = Instant::now();
        let mut s = ResponseStore::new(2, usize::MAX, TTL);
        assert!(s.insert("a".into(), stored("a"), t));
        assert!(s.insert("b".into(), stored("b"), t));
        // Reading `a` makes `b` the least recently used.
        assert!(s.get("a", t).is_some());
        assert!(s.insert("c".into(), stored("c"), t));
        assert!(s.get("b", t).is_none());
        assert!(s.get("a", t).is_some() && s.get("c", t).is_some());
        assert_eq!(s.len(), 2);
        assert!(s.remove("a"));
        assert!(!s.remove("a"));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn unused_responses_expire() {
        let t = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut s = ResponseStore::new(8, usize::MAX, ttl);
        s.insert("a".into(), stored("a"), t);
        s.insert("b".into(), stored("b"), t + Duration::from_secs(5));
        // Read at 9 s, `a` lives until 19 s; `b`, unread, until 15 s.
        assert!(s.get("a", t + Duration::from_secs(9)).is_some());
        assert!(s.get("b", t + Duration::from_secs(16)).is_none());
        assert!(s.get("a", t + Duration::from_secs(18)).is_some());
        assert!(s.get("a", t + Duration::from_secs(40)).is_none());
        assert!(s.is_empty());
    }

    #[test]
    fn the_byte_budget_evicts_and_refuses_what_cannot_fit() {
        let t = Instant::now();
        let one = stored("x").bytes();
        let mut s = ResponseStore::new(100, 2 * one, TTL);
        s.insert("a".into(), stored("a"), t);
        s.insert("b".into(), stored("b"), t);
        s.insert("c".into(), stored("c"), t);
        assert_eq!(s.len(), 2);
        assert!(s.get("a", t).is_none());
        assert_eq!(s.bytes, 2 * one);
        let huge = stored(&"y".repeat(3 * one));
        assert!(!s.insert("h".into(), huge, t));
        assert_eq!(s.len(), 2, "a response too big to keep evicts nothing");
        // Storing an id again replaces it.
        s.insert("b".into(), stored("B"), t);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get("b", t).unwrap().response["id"], "B");
    }
}
