//! A bounded multi-producer, multi-consumer queue whose waits sleep at once.
//!
//! Why not crossbeam-channel, which the pipeline used first: its blocking receive spins
//! and then calls `sched_yield` about four times before it sleeps. The write pipeline
//! wakes a stripe writer and one worker per member for every stripe and every sync
//! round; on a machine with fewer cores than those threads (this one has two) each yield
//! hands the CPU to another spinning thread, and a flush of one 4 KiB block measured
//! 29 yields and 300–460 µs where the member I/O takes about 150 µs. Here a waiter
//! sleeps on a condition variable the moment the queue is empty (or full), and the
//! mutex is the standard library's, which spins briefly without yielding.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    receivers: usize,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while the lock is held leaves the queue consistent (every critical
        // section is a push, a pop or a count): go on with it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The sending half; cloned for every producer. The queue closes for receivers when the
/// last sender is dropped (once they have taken what is left).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half; cloned for every consumer. Sends fail once every receiver is gone.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// The receivers are gone: the item comes back.
#[derive(Debug, PartialEq, Eq)]
pub struct SendError<T>(pub T);

/// Why `try_send` did not queue the item (it comes back).
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    Full(T),
    Disconnected(T),
}

/// Every sender is gone and the queue is empty.
#[derive(Debug, PartialEq, Eq)]
pub struct RecvError;

/// Why `try_recv` returned nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum TryRecvError {
    Empty,
    Disconnected,
}

/// Why `recv_timeout` returned nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum RecvTimeoutError {
    Timeout,
    Disconnected,
}

/// A queue that holds at most `capacity` items (at least one).
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { items: VecDeque::with_capacity(capacity.max(1)), senders: 1, receivers: 1 }),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
        capacity: capacity.max(1),
    });
    (Sender { shared: shared.clone() }, Receiver { shared })
}

impl<T> Sender<T> {
    /// Queue `item`, waiting while the queue is full.
    pub fn send(&self, item: T) -> Result<(), SendError<T>> {
        let mut state = self.shared.lock();
        loop {
            if state.receivers == 0 {
                return Err(SendError(item));
            }
            if state.items.len() < self.shared.capacity {
                state.items.push_back(item);
                drop(state);
                self.shared.not_empty.notify_one();
                return Ok(());
            }
            state = self.shared.not_full.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Queue `item` if there is room now.
    pub fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let mut state = self.shared.lock();
        if state.receivers == 0 {
            return Err(TrySendError::Disconnected(item));
        }
        if state.items.len() >= self.shared.capacity {
            return Err(TrySendError::Full(item));
        }
        state.items.push_back(item);
        drop(state);
        self.shared.not_empty.notify_one();
        Ok(())
    }
}

impl<T> Receiver<T> {
    /// The next item, waiting while the queue is empty; an error once it is empty and
    /// every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        let mut state = self.shared.lock();
        loop {
            if let Some(item) = self.take(&mut state) {
                return Ok(item);
            }
            if state.senders == 0 {
                return Err(RecvError);
            }
            state = self.shared.not_empty.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The next item if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut state = self.shared.lock();
        match self.take(&mut state) {
            Some(item) => Ok(item),
            None if state.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The next item, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some(item) = self.take(&mut state) {
                return Ok(item);
            }
            if state.senders == 0 {
                return Err(RecvTimeoutError::Disconnected);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            state = self.shared.not_empty.wait_timeout(state, left).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
    }

    /// Items as they arrive, until the queue is empty and every sender is gone.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.recv().ok())
    }

    /// The items queued now, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    fn take(&self, state: &mut State<T>) -> Option<T> {
        let item = state.items.pop_front()?;
        self.shared.not_full.notify_one();
        Some(item)
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;

    fn into_iter(self) -> IntoIter<T> {
        IntoIter(self)
    }
}

/// Items as they arrive, until the queue is empty and every sender is gone.
pub struct IntoIter<T>(Receiver<T>);

impl<T> Iterator for IntoIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.0.recv().ok()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender { shared: self.shared.clone() }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.lock().receivers += 1;
        Receiver { shared: self.shared.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders -= 1;
        if state.senders == 0 {
            drop(state);
            // Receivers waiting on an empty queue learn that nothing more will come.
            self.shared.not_empty.notify_all();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.receivers -= 1;
        if state.receivers == 0 {
            // Nobody will take what is queued: drop it now (it may hold resources its
            // senders wait for), and wake senders waiting for room.
            let items = std::mem::take(&mut state.items);
            drop(state);
            drop(items);
            self.shared.not_full.notify_all();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Sender { .. }")
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Receiver { .. }")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_out_in_order_and_the_bound_holds() {
        let (sender, receiver) = bounded(2);
        sender.send(1).unwrap();
        sender.send(2).unwrap();
        assert_eq!(sender.try_send(3), Err(TrySendError::Full(3)));
        assert_eq!(receiver.recv(), Ok(1));
        sender.try_send(3).unwrap();
        assert_eq!(receiver.try_recv(), Ok(2));
        assert_eq!(receiver.recv_timeout(Duration::from_millis(1)), Ok(3));
        assert_eq!(receiver.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(receiver.recv_timeout(Duration::from_millis(1)), Err(RecvTimeoutError::Timeout));
    }

    #[test]
    fn a_full_sender_waits_for_room_and_receivers_see_the_end() {
        let (sender, receiver) = bounded(1);
        let producer = std::thread::spawn(move || {
            for item in 0..1000 {
                sender.send(item).unwrap();
            }
        });
        let consumers: Vec<_> = (0..3)
            .map(|_| {
                let receiver = receiver.clone();
                std::thread::spawn(move || receiver.iter().collect::<Vec<i32>>())
            })
            .collect();
        drop(receiver);
        producer.join().unwrap();
        let mut all: Vec<i32> = consumers.into_iter().flat_map(|consumer| consumer.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn sends_fail_once_the_receivers_are_gone_and_what_was_queued_is_dropped() {
        let (sender, receiver) = bounded(4);
        let held = Arc::new(());
        sender.send(held.clone()).unwrap();
        drop(receiver);
        assert_eq!(Arc::strong_count(&held), 1, "the queued item is dropped with the last receiver");
        assert!(sender.send(held.clone()).is_err());
        let (sender, receiver) = bounded::<u8>(1);
        drop(sender);
        assert_eq!(receiver.recv(), Err(RecvError));
        assert_eq!(receiver.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(receiver.recv_timeout(Duration::from_millis(1)), Err(RecvTimeoutError::Disconnected));
    }
}
