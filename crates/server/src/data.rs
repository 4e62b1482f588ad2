//! A bulk data connection: the server sends (download) or sinks (upload) frames until its test
//! ends, answering the client's pings with pongs. One connection per flow; bytes paced to the
//! test's `--max-rate`; pongs that a client does not read are dropped, never queued without
//! bound.

use crate::acked;
use crate::lines::{send, Reader};
use crate::session::{FlowCounters, Session};
use bloatlab_netio as netio;
use bloatlab_proto::{frame, Direction, RefuseReason, ServerMsg};
use portable_atomic::AtomicU64;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout_at, Instant, MissedTickBehavior};

/// Pongs waiting for a download's writer: a client pings every 100 ms at most; one that sends
/// them faster than it reads the replies loses the excess (counted), not the server's memory.
const PONG_QUEUE: usize = 64;

pub(crate) async fn run(
    r: Reader,
    mut w: OwnedWriteHalf,
    peer: SocketAddr,
    session: Arc<Session>,
    flow_id: u16,
) {
    let Some(spec) = session
        .request
        .flows
        .iter()
        .find(|f| f.id == flow_id)
        .cloned()
    else {
        let _ = send(
            &mut w,
            &ServerMsg::Refused {
                reason: RefuseReason::BadRequest,
                message: format!("no flow {flow_id} in this test"),
            },
        )
        .await;
        return;
    };
    let sock = w.as_ref();
    let dscp = netio::apply_dscp(socket2::SockRef::from(sock), spec.dscp, &peer).ok();
    if spec.direction == Direction::Down {
        if let Some(cc) = &spec.cc {
            if let Err(e) = netio::set_cc(sock, cc) {
                let _ = send(
                    &mut w,
                    &ServerMsg::Refused {
                        reason: RefuseReason::BadRequest,
                        message: e.to_string(),
                    },
                )
                .await;
                return;
            }
        }
    }
    let cc = netio::cc(sock);
    let counters = match session.claim_flow(flow_id, cc.clone()) {
        Ok(c) => c,
        Err(why) => {
            let _ = send(
                &mut w,
                &ServerMsg::Refused {
                    reason: RefuseReason::Limit,
                    message: why,
                },
            )
            .await;
            return;
        }
    };
    if send(&mut w, &ServerMsg::DataOk { cc, dscp }).await.is_err() {
        return;
    }
    let deadline = Instant::from_std(session.deadline);
    let work = async {
        match spec.direction {
            Direction::Down => download(r, w, &session, &counters).await,
            Direction::Up => upload(r, w, &session, &counters.bytes).await,
        }
    };
    tokio::select! {
        _ = timeout_at(deadline, work) => {}
        _ = session.ended() => {}
    }
}

/// Download: frames out, pongs between them; the client's pings come in on the reader; what
/// the client acknowledged read from the socket every 10 ms.
async fn download(
    mut r: Reader,
    mut w: OwnedWriteHalf,
    session: &Session,
    counters: &FlowCounters,
) {
    let counter = &counters.bytes;
    let fd = w.as_ref().as_raw_fd();
    let sampler = async {
        let Some(log) = &counters.acked else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval(Duration::from_nanos(acked::BUCKET_NS));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The socket lives as long as this future (both end with the select below).
            let Ok(i) = netio::tcp_info(&fd) else {
                return std::future::pending().await;
            };
            let acked = i.bytes_acked + i.sacked_bytes;
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(netio::mono_ns(), acked);
        }
    };
    let (pong_tx, mut pong_rx) = mpsc::channel::<u64>(PONG_QUEUE);
    let reader = async {
        let mut decoder = frame::Decoder::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let fed = decoder.feed(&buf[..n], |e| {
                if let frame::Event::Ping(id) = e {
                    if pong_tx.try_send(id).is_err() {
                        session.pings_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            if fed.is_err() {
                return;
            }
        }
    };
    // An RPM test's flows are responsive, as the draft asks of its servers: unsent data in the
    // socket kept near 5 ms of the connection's rate, written in frames of about that size (at
    // most HTTP/2's 16 KiB) when the kernel has room, so a pong waits behind the network's
    // queue, not behind ours.
    let responsive = session.request.test == "rpm";
    let writer = async {
        let mut chunk = vec![0u8; frame::HEADER_LEN + frame::DATA_PAYLOAD];
        loop {
            while let Ok(id) = pong_rx.try_recv() {
                if w.write_all(&frame::pong(id)).await.is_err() {
                    return;
                }
            }
            let payload = match responsive {
                true => frame::responsive_payload(
                    netio::keep_unsent_small(w.as_ref())
                        .unwrap_or(frame::RESPONSIVE_PAYLOAD as u32),
                ),
                false => frame::DATA_PAYLOAD,
            };
            // The kernel checks its unsent limit only when a write needs a new buffer
            // (netio::sendbuf): asked first, it holds half the limit and a frame.
            if responsive
                && std::future::poll_fn(|cx| netio::sendbuf::poll_unsent_room(w.as_ref(), cx))
                    .await
                    .is_err()
            {
                return;
            }
            let wait = session.pace(payload);
            if !wait.is_zero() {
                sleep(wait).await;
            }
            chunk[..frame::HEADER_LEN].copy_from_slice(&frame::data_header(payload));
            if w.write_all(&chunk[..frame::HEADER_LEN + payload])
                .await
                .is_err()
            {
                return;
            }
            counter.fetch_add(payload as u64, Ordering::Relaxed);
        }
    };
    // Either side ending (the client closed, or a write failed) ends the flow.
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
        _ = sampler => {}
    }
    let _ = w.shutdown().await;
}

/// Upload: frames in, counted and paced (a client above `--max-rate` is slowed by TCP's own
/// flow control as the server reads more slowly); pongs go straight out on the idle direction.
async fn upload(mut r: Reader, mut w: OwnedWriteHalf, session: &Session, counter: &AtomicU64) {
    let mut decoder = frame::Decoder::new();
    let mut buf = vec![0u8; frame::READ_BUFFER];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut pings = Vec::new();
        let mut data = 0usize;
        let fed = decoder.feed(&buf[..n], |e| match e {
            frame::Event::Data(len) => data += len,
            frame::Event::Ping(id) => pings.push(id),
            frame::Event::Pong(_) => {}
        });
        if fed.is_err() {
            return;
        }
        counter.fetch_add(data as u64, Ordering::Relaxed);
        for id in pings {
            if w.write_all(&frame::pong(id)).await.is_err() {
                return;
            }
        }
        let wait = session.pace(n);
        if !wait.is_zero() {
            sleep(wait).await;
        }
    }
}
