//! Decoding and encoding record pushes through the verifier's cache of record encodings.
//!
//! Every agent of a region receives every record of its region, usually more than once. Where
//! the verifier remembers record encodings ([`RecordCache::caches_encodings`](shoal_catalog::RecordCache::caches_encodings), the simulator's),
//! a push is decoded record by record and each record whose encoding is remembered is taken
//! from the cache instead of being decoded and allocated again. The result is the value
//! [`StreamMessage::decode`](crate::messages::StreamMessage::decode) returns for the same
//! bytes: anything this decoder does not accept (an unknown record, a non-canonical length, a
//! decode error, trailing bytes, a push over its limit) makes it give up, and the caller then
//! decodes the message the ordinary way, which also reports the error.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use shoal_catalog::Verifier;
use shoal_proto::envelope::{self, MessageKind};

use crate::messages::{RecordPush, MAX_RECORDS_PER_PUSH};

/// Decodes a [`RecordPush`] body (the bytes after the envelope header) as
/// `envelope::decode_body::<RecordPush>` would, taking records from `cache` where it remembers
/// their encodings and teaching it the others. `None` when the body is not a canonical,
/// complete push of at most [`MAX_RECORDS_PER_PUSH`] records.
pub(crate) fn decode_push<V: Verifier>(body: &[u8], cache: &V) -> Option<RecordPush> {
    let (lifecycle_len, mut rest) = take_len(body)?;
    if lifecycle_len > MAX_RECORDS_PER_PUSH {
        return None;
    }
    let mut lifecycle = Vec::with_capacity(lifecycle_len);
    for _ in 0..lifecycle_len {
        let (rec, r) = take_record(
            rest,
            |input| cache.encoded_lifecycle(input),
            |enc, rec| cache.remember_lifecycle_encoding(enc, rec),
        )?;
        lifecycle.push(rec);
        rest = r;
    }
    let (health_len, r) = take_len(rest)?;
    rest = r;
    if lifecycle_len + health_len > MAX_RECORDS_PER_PUSH {
        return None;
    }
    let mut health = Vec::with_capacity(health_len);
    for _ in 0..health_len {
        let (rec, r) = take_record(
            rest,
            |input| cache.encoded_health(input),
            |enc, rec| cache.remember_health_encoding(enc, rec),
        )?;
        health.push(rec);
        rest = r;
    }
    if !rest.is_empty() {
        return None;
    }
    Some(RecordPush { lifecycle, health })
}

/// Encodes `push` as [`StreamMessage::encode`](crate::messages::StreamMessage::encode) would
/// (header, then the postcard body), copying each record's encoding from `cache` where it
/// remembers one and serializing the others. `None` when longer than `max_bytes`.
pub(crate) fn encode_push<V: Verifier>(
    push: &RecordPush,
    cache: &V,
    max_bytes: usize,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&envelope::MAGIC);
    out.push(envelope::PROTOCOL_VERSION);
    out.push(MessageKind::RecordPush as u8);
    out = postcard::to_extend(&push.lifecycle.len(), out).expect("a length serialises");
    for rec in &push.lifecycle {
        if !cache.append_lifecycle_encoding(rec, &mut out) {
            out = postcard::to_extend(&**rec, out).expect("plain data always serialises");
        }
    }
    out = postcard::to_extend(&push.health.len(), out).expect("a length serialises");
    for rec in &push.health {
        if !cache.append_health_encoding(rec, &mut out) {
            out = postcard::to_extend(&**rec, out).expect("plain data always serialises");
        }
    }
    (out.len() <= max_bytes).then_some(out)
}

/// Takes a sequence length (a postcard varint) off the front of `input`. Only the canonical
/// encoding (the one postcard writes) is accepted, so any decoder reads the same number.
fn take_len(input: &[u8]) -> Option<(usize, &[u8])> {
    let (n, rest) = postcard::take_from_bytes::<u64>(input).ok()?;
    let used = &input[..input.len() - rest.len()];
    let mut buf = [0u8; 10];
    let canonical = postcard::to_slice(&n, &mut buf).ok()?;
    if *canonical != *used {
        return None;
    }
    Some((usize::try_from(n).ok()?, rest))
}

/// Takes one record off the front of `input`: from the cache when it remembers an encoding
/// that `input` starts with, else by decoding it (and remembering its encoding).
fn take_record<T: DeserializeOwned>(
    input: &[u8],
    lookup: impl FnOnce(&[u8]) -> Option<(Arc<T>, usize)>,
    remember: impl FnOnce(&[u8], &Arc<T>),
) -> Option<(Arc<T>, &[u8])> {
    if let Some((rec, len)) = lookup(input) {
        debug_assert!(
            len <= input.len(),
            "a remembered encoding is a prefix of the input"
        );
        return Some((rec, input.get(len..)?));
    }
    let (value, rest) = postcard::take_from_bytes::<T>(input).ok()?;
    let rec = Arc::new(value);
    remember(&input[..input.len() - rest.len()], &rec);
    Some((rec, rest))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use shoal_catalog::testkit::Fixture;
    use shoal_proto::envelope::HEADER_BYTES;
    use shoal_proto::{
        HealthStatus, LifecycleState, SignatureError, SignedHealth, SignedLifecycle,
    };

    use super::*;
    use crate::messages::StreamMessage;

    /// A verifier that only remembers encodings, in a list.
    #[derive(Default)]
    struct Cache {
        lifecycle: RefCell<Vec<(Vec<u8>, Arc<SignedLifecycle>)>>,
        health: RefCell<Vec<(Vec<u8>, Arc<SignedHealth>)>>,
        hits: RefCell<usize>,
    }

    fn find<T>(list: &[(Vec<u8>, Arc<T>)], input: &[u8]) -> Option<(Arc<T>, usize)> {
        list.iter()
            .find(|(enc, _)| input.starts_with(enc))
            .map(|(enc, rec)| (Arc::clone(rec), enc.len()))
    }

    impl Verifier for Cache {
        fn verify_lifecycle(&self, _: &SignedLifecycle) -> Result<(), SignatureError> {
            Ok(())
        }
        fn verify_health(
            &self,
            _: &SignedHealth,
            _: &shoal_proto::VerifyingKey,
        ) -> Result<(), SignatureError> {
            Ok(())
        }
    }

    impl shoal_catalog::RecordCache for Cache {
        fn caches_encodings(&self) -> bool {
            true
        }
        fn encoded_lifecycle(&self, input: &[u8]) -> Option<(Arc<SignedLifecycle>, usize)> {
            let hit = find(&self.lifecycle.borrow(), input);
            *self.hits.borrow_mut() += usize::from(hit.is_some());
            hit
        }
        fn remember_lifecycle_encoding(&self, enc: &[u8], rec: &Arc<SignedLifecycle>) {
            self.lifecycle
                .borrow_mut()
                .push((enc.to_vec(), Arc::clone(rec)));
        }
        fn encoded_health(&self, input: &[u8]) -> Option<(Arc<SignedHealth>, usize)> {
            let hit = find(&self.health.borrow(), input);
            *self.hits.borrow_mut() += usize::from(hit.is_some());
            hit
        }
        fn remember_health_encoding(&self, enc: &[u8], rec: &Arc<SignedHealth>) {
            self.health
                .borrow_mut()
                .push((enc.to_vec(), Arc::clone(rec)));
        }
        fn append_lifecycle_encoding(&self, rec: &Arc<SignedLifecycle>, out: &mut Vec<u8>) -> bool {
            let list = self.lifecycle.borrow();
            let found = list.iter().find(|(_, r)| Arc::ptr_eq(r, rec));
            found
                .inspect(|(enc, _)| out.extend_from_slice(enc))
                .is_some()
        }
        fn append_health_encoding(&self, rec: &Arc<SignedHealth>, out: &mut Vec<u8>) -> bool {
            let list = self.health.borrow();
            let found = list.iter().find(|(_, r)| Arc::ptr_eq(r, rec));
            found
                .inspect(|(enc, _)| out.extend_from_slice(enc))
                .is_some()
        }
    }

    fn push(f: &Fixture, n: u64) -> RecordPush {
        RecordPush {
            lifecycle: (0..n)
                .map(|i| Arc::new(f.lifecycle(&format!("i{i}"), 1, i + 1, LifecycleState::Ready)))
                .collect(),
            health: vec![Arc::new(f.health("i0", 0, 1, 1, 1, HealthStatus::Failing))],
        }
    }

    fn body(p: &RecordPush) -> Vec<u8> {
        let bytes = StreamMessage::Push(p.clone()).encode(usize::MAX).unwrap();
        bytes[HEADER_BYTES..].to_vec()
    }

    #[test]
    fn gives_what_the_plain_decoder_gives_cold_and_warm() {
        let f = Fixture::new();
        let cache = Cache::default();
        let p = push(&f, 3);
        let b = body(&p);
        assert_eq!(decode_push(&b, &cache), Some(p.clone()));
        assert_eq!(*cache.hits.borrow(), 0);
        assert_eq!(decode_push(&b, &cache), Some(p.clone()));
        assert_eq!(*cache.hits.borrow(), 4);
        // A push sharing some records with the cache.
        let mut q = push(&f, 5);
        q.health.clear();
        assert_eq!(decode_push(&body(&q), &cache), Some(q));
        assert_eq!(
            decode_push(&body(&RecordPush::default()), &cache),
            Some(RecordPush::default())
        );
    }

    #[test]
    fn encodes_what_the_plain_encoder_encodes_with_and_without_remembered_records() {
        let f = Fixture::new();
        let cache = Cache::default();
        let p = push(&f, 3);
        let plain = StreamMessage::Push(p.clone()).encode(usize::MAX).unwrap();
        assert_eq!(encode_push(&p, &cache, usize::MAX), Some(plain.clone()));
        // The decoded copy's records are the remembered ones: their bytes are copied.
        let decoded = decode_push(&plain[HEADER_BYTES..], &cache).unwrap();
        let mut partly = decoded.clone();
        partly
            .lifecycle
            .push(Arc::new(f.lifecycle("new", 1, 9, LifecycleState::Ready)));
        for q in [decoded, partly] {
            let plain = StreamMessage::Push(q.clone()).encode(usize::MAX).unwrap();
            assert_eq!(encode_push(&q, &cache, usize::MAX), Some(plain.clone()));
            assert_eq!(encode_push(&q, &cache, plain.len()), Some(plain.clone()));
            assert_eq!(encode_push(&q, &cache, plain.len() - 1), None);
        }
    }

    #[test]
    fn a_record_that_differs_after_a_remembered_prefix_is_decoded_not_taken() {
        let f = Fixture::new();
        let cache = Cache::default();
        let p = push(&f, 1);
        assert_eq!(decode_push(&body(&p), &cache), Some(p.clone()));
        let mut other = (*p.lifecycle[0]).clone();
        other.signature.1[31] ^= 1;
        let q = RecordPush {
            lifecycle: vec![Arc::new(other)],
            health: vec![],
        };
        assert_eq!(decode_push(&body(&q), &cache), Some(q));
    }

    #[test]
    fn gives_up_on_anything_the_plain_decoder_would_not_take_as_is() {
        let f = Fixture::new();
        let cache = Cache::default();
        let b = body(&push(&f, 2));
        let mut trailing = b.clone();
        trailing.push(0);
        assert_eq!(decode_push(&trailing, &cache), None);
        assert_eq!(decode_push(&b[..b.len() - 1], &cache), None);
        // A non-canonical length: 2 written in two bytes.
        let mut long_len = vec![0x82, 0x00];
        long_len.extend_from_slice(&b[1..]);
        assert_eq!(decode_push(&long_len, &cache), None);
        // Warm cache, same answers.
        assert!(decode_push(&b, &cache).is_some());
        assert_eq!(decode_push(&trailing, &cache), None);
        assert_eq!(decode_push(&long_len, &cache), None);
        let over = body(&push(&f, MAX_RECORDS_PER_PUSH as u64));
        assert_eq!(decode_push(&over, &cache), None);
    }
}
