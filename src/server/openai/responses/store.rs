//! The responses `POST /v1/responses` keeps (`store`, on by default as at
//! OpenAI) for `GET`/`DELETE /v1/responses/{id}` and for a later request's
//! `previous_response_id`. In memory only, so a restart loses them all.
//!
//! Each API key has a shelf of its own ([`Owner`](crate::server::http::auth::Owner)): a response is found
//! only with the key that stored it, and one key's traffic evicts only its
//! own. A shelf holds an equal share of the store, bounded three ways: at
//! most [`CAPACITY`] responses, at most [`MAX_BYTES`] of them, each kept
//! [`TTL`] after it was last stored or read; past a bound the least
//! recently used go first. Responses are held as the JSON bytes they are
//! sent as, so what is counted is what is held (a message shared by a
//! conversation's responses is counted once for each). The store belongs
//! to the server's `AppState`, behind its mutex; nothing here awaits.

use crate::server::http::auth::Owner;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use indexmap::IndexMap;

/// Most responses kept, over all keys.
pub const CAPACITY: usize = 1024;
/// How long a response is kept after it was last stored or read.
pub const TTL: Duration = Duration::from_secs(60 * 60);
/// Most bytes kept over all keys (each response's JSON plus its
/// conversation's).
pub const MAX_BYTES: usize = 256 << 20;

/// One kept response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The Response object, as `GET` returns it.
    pub response: Bytes,
    /// The conversation a follow-up continues, a chat message's JSON each
    /// (without the request's `instructions`, which OpenAI does not carry
    /// over), the reply included. Shared with the responses that follow.
    pub conversation: Vec<Bytes>,
}

impl Stored {
    fn bytes(&self) -> usize {
        self.response.len() + self.conversation.iter().map(Bytes::len).sum::<usize>()
    }
}

/// Every owner's shelf.
pub struct ResponseStore {
    shelves: Vec<Shelf>,
}

impl ResponseStore {
    /// A store for `owners` keys (at least one), each with an equal share
    /// of `capacity` and `max_bytes`.
    pub fn new(owners: usize, capacity: usize, max_bytes: usize, ttl: Duration) -> Self {
        let owners = owners.max(1);
        ResponseStore {
            shelves: (0..owners)
                .map(|_| Shelf::new(capacity / owners, max_bytes / owners, ttl))
                .collect(),
        }
    }

    /// The store with the default bounds.
    pub fn for_owners(owners: usize) -> Self {
        ResponseStore::new(owners, CAPACITY, MAX_BYTES, TTL)
    }

    /// Keeps `stored` under `id` on `owner`'s shelf, evicting what its
    /// bounds require; a response larger than the shelf's byte budget is
    /// not kept (false).
    pub fn insert(&mut self, owner: Owner, id: String, stored: Stored, now: Instant) -> bool {
        self.shelves
            .get_mut(owner.0)
            .is_some_and(|s| s.insert(id, stored, now))
    }

    /// The response `owner` kept under `id`, now the most recently used.
    pub fn get(&mut self, owner: Owner, id: &str, now: Instant) -> Option<Stored> {
        self.shelves.get_mut(owner.0)?.get(id, now)
    }

    /// Forgets `owner`'s `id`; false if it was not kept.
    pub fn remove(&mut self, owner: Owner, id: &str) -> bool {
        self.shelves.get_mut(owner.0).is_some_and(|s| s.remove(id))
    }
}

struct Entry {
    stored: Stored,
    bytes: usize,
    last_used: Instant,
}

/// One owner's responses, least recently used first.
struct Shelf {
    entries: IndexMap<String, Entry>,
    bytes: usize,
    capacity: usize,
    max_bytes: usize,
    ttl: Duration,
}

impl Shelf {
    fn new(capacity: usize, max_bytes: usize, ttl: Duration) -> Self {
        Shelf {
            entries: IndexMap::new(),
            bytes: 0,
            capacity,
            max_bytes,
            ttl,
        }
    }

    fn insert(&mut self, id: String, stored: Stored, now: Instant) -> bool {
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

    fn get(&mut self, id: &str, now: Instant) -> Option<Stored> {
        self.expire(now);
        let (_, key, mut entry) = self.entries.shift_remove_full(id)?;
        entry.last_used = now;
        let stored = entry.stored.clone();
        self.entries.insert(key, entry);
        Some(stored)
    }

    fn remove(&mut self, id: &str) -> bool {
        match self.entries.shift_remove(id) {
            Some(old) => {
                self.bytes -= old.bytes;
                true
            }
            None => false,
        }
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
    use super::*;

    const ONE: Owner = Owner(0);

    fn stored(text: &str) -> Stored {
        Stored {
            response: Bytes::from(format!("{{\"id\": \"{text}\"}}")),
            conversation: vec![Bytes::from(format!(
                "{{\"role\": \"user\", \"content\": \"{text}\"}}"
            ))],
        }
    }

    #[test]
    fn least_recently_used_goes_first() {
        let t = Instant::now();
        let mut s = ResponseStore::new(1, 2, usize::MAX, TTL);
        assert!(s.insert(ONE, "a".into(), stored("a"), t));
        assert!(s.insert(ONE, "b".into(), stored("b"), t));
        // Reading `a` makes `b` the least recently used.
        assert!(s.get(ONE, "a", t).is_some());
        assert!(s.insert(ONE, "c".into(), stored("c"), t));
        assert!(s.get(ONE, "b", t).is_none());
        assert!(s.get(ONE, "a", t).is_some() && s.get(ONE, "c", t).is_some());
        assert_eq!(s.shelves[0].entries.len(), 2);
        assert!(s.remove(ONE, "a"));
        assert!(!s.remove(ONE, "a"));
        assert_eq!(s.shelves[0].entries.len(), 1);
    }

    #[test]
    fn unused_responses_expire() {
        let t = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut s = ResponseStore::new(1, 8, usize::MAX, ttl);
        s.insert(ONE, "a".into(), stored("a"), t);
        s.insert(ONE, "b".into(), stored("b"), t + Duration::from_secs(5));
        // Read at 9 s, `a` lives until 19 s; `b`, unread, until 15 s.
        assert!(s.get(ONE, "a", t + Duration::from_secs(9)).is_some());
        assert!(s.get(ONE, "b", t + Duration::from_secs(16)).is_none());
        assert!(s.get(ONE, "a", t + Duration::from_secs(18)).is_some());
        assert!(s.get(ONE, "a", t + Duration::from_secs(40)).is_none());
        assert!(s.shelves[0].entries.is_empty());
    }

    #[test]
    fn the_byte_budget_evicts_and_refuses_what_cannot_fit() {
        let t = Instant::now();
        let one = stored("x").bytes();
        let mut s = ResponseStore::new(1, 100, 2 * one, TTL);
        s.insert(ONE, "a".into(), stored("a"), t);
        s.insert(ONE, "b".into(), stored("b"), t);
        s.insert(ONE, "c".into(), stored("c"), t);
        assert_eq!(s.shelves[0].entries.len(), 2);
        assert!(s.get(ONE, "a", t).is_none());
        assert_eq!(s.shelves[0].bytes, 2 * one);
        let huge = stored(&"y".repeat(3 * one));
        assert!(!s.insert(ONE, "h".into(), huge, t));
        assert_eq!(
            s.shelves[0].entries.len(),
            2,
            "a response too big to keep evicts nothing"
        );
        // Storing an id again replaces it.
        s.insert(ONE, "b".into(), stored("B"), t);
        assert_eq!(s.shelves[0].entries.len(), 2);
        assert_eq!(
            &s.get(ONE, "b", t).unwrap().response[..],
            b"{\"id\": \"B\"}"
        );
    }

    /// A key finds only its own responses, and filling its share evicts
    /// nothing of another key's.
    #[test]
    fn each_key_has_its_own_share() {
        let t = Instant::now();
        let (a, b) = (Owner(0), Owner(1));
        let mut s = ResponseStore::new(2, 4, usize::MAX, TTL);
        assert!(s.insert(a, "r".into(), stored("a"), t));
        assert!(s.get(b, "r", t).is_none());
        assert!(!s.remove(b, "r"));
        for i in 0..10 {
            assert!(s.insert(b, format!("b{i}"), stored("b"), t));
        }
        assert_eq!(s.shelves[1].entries.len(), 2, "each key holds half");
        assert!(s.get(a, "r", t).is_some());
        assert!(s.get(Owner(2), "r", t).is_none());
        assert!(!s.insert(Owner(2), "r".into(), stored("c"), t));
    }
}
