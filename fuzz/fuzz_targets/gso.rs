//! What a TUN device hands the lab: a virtio-net header and a packet, shaped by the sending
//! namespace's kernel and by whatever its processes put in their packets. Splitting it into
//! wire segments and merging those back must never panic, and must keep every payload byte.
#![no_main]
use bloatlab_lab_model::gso::{coalesce, split};
use bloatlab_lab_model::vnet::{VnetHdr, VNET_HDR_LEN};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Some((hdr, packet)) = data.split_first_chunk::<VNET_HDR_LEN>() else {
        return;
    };
    let vnet = VnetHdr::from_bytes(hdr);
    let Some(segments) = split(&vnet, Arc::new(packet.to_vec()), 1) else {
        return;
    };
    let payload: usize = segments.iter().map(|p| p.len() - p.data.len()).sum();
    let written: usize = coalesce(segments)
        .iter()
        .map(|w| w.payload.as_ref().map_or(0, |(_, r)| r.len()))
        .sum();
    assert_eq!(payload, written);
});
