//! Turns: how many heavy requests each user, and everyone together, may have
//! in the head at once.
//!
//! The head's one actor serves requests one after another, so what bounds how
//! long anyone waits for it is how much work is queued ahead of them. Every
//! HTTP API request and every heavy QUIC read (`requests::heavy`) takes a
//! [`Turn`] before it reaches the actor and gives it back when its answer is
//! built (or its caller gives up): first one of its user's
//! [`Turns::per_user`] turns, then one of everyone's. A user's burst so waits
//! behind that user's own turns, never ahead of other users' requests, and
//! the actor holds at most `per_user` requests of any one user; a QUIC client
//! asking for something light (`xp nodes`) takes no turn at all.
//!
//! Not here: the time limit on the wait (the callers', which answer
//! "busy" past it), and the work itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests the HTTP API and heavy QUIC reads have in the head at once.
pub(crate) const MAX_TURNS: usize = 8;
/// Of those, how many one user may have: one, so that on a small head (two
/// cores) one user's burst keeps at most one core busy with its reads and
/// its answers, and everyone else's requests find the other.
pub(crate) const MAX_TURNS_PER_USER: usize = 1;

/// The turns of every user and of everyone.
#[derive(Debug)]
pub(crate) struct Turns {
    all: Arc<Semaphore>,
    per_user: usize,
    users: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// A turn held: given back when dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    _user: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl Turns {
    /// `all` turns in all, `per_user` of them for any one user.
    pub(crate) fn new(all: usize, per_user: usize) -> Self {
        Self {
            all: Arc::new(Semaphore::new(all)),
            per_user,
            users: Mutex::new(HashMap::new()),
        }
    }

    /// The head's turns: [`MAX_TURNS`], [`MAX_TURNS_PER_USER`] per user.
    pub(crate) fn standard() -> Self {
        Self::new(MAX_TURNS, MAX_TURNS_PER_USER)
    }

    /// Waits for one of `user`'s turns, then for one of everyone's.
    pub(crate) async fn take(&self, user: &str) -> Turn {
        let mine = self.user_turns(user);
        // Neither semaphore is ever closed, so `acquire_owned` does not fail.
        let user = mine
            .acquire_owned()
            .await
            .expect("a user's turns are never closed");
        let all = self
            .all
            .clone()
            .acquire_owned()
            .await
            .expect("the head's turns are never closed");
        Turn {
            _user: user,
            _all: all,
        }
    }

    /// `user`'s semaphore; users nobody waits for or holds a turn of are
    /// forgotten, so the map holds only users with requests in flight.
    fn user_turns(&self, user: &str) -> Arc<Semaphore> {
        let mut users = self
            .users
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        users.retain(|_, turns| Arc::strong_count(turns) > 1);
        users
            .entry(user.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_user)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Whether a turn of `user` comes within a short wait.
    async fn comes(turns: &Turns, user: &str) -> Option<Turn> {
        tokio::time::timeout(Duration::from_millis(50), turns.take(user))
            .await
            .ok()
    }

    #[tokio::test]
    async fn one_user_waits_behind_their_own_turns_and_others_go_ahead() {
        let turns = Turns::new(3, 2);
        let first = comes(&turns, "alice").await.expect("alice's first turn");
        let second = comes(&turns, "alice").await.expect("alice's second turn");
        assert!(
            comes(&turns, "alice").await.is_none(),
            "alice has two at once"
        );
        let bob = comes(&turns, "bob")
            .await
            .expect("bob goes ahead of alice's third");
        assert!(comes(&turns, "carol").await.is_none(), "three in all");
        drop(first);
        assert!(comes(&turns, "carol").await.is_some());
        drop((second, bob));
        assert!(comes(&turns, "alice").await.is_some());
    }

    #[tokio::test]
    async fn users_without_requests_are_forgotten() {
        let turns = Turns::new(4, 1);
        for user in ["a", "b", "c"] {
            drop(comes(&turns, user).await);
        }
        let held = comes(&turns, "d").await;
        assert_eq!(turns.users.lock().unwrap().len(), 1);
        drop(held);
    }
}
