//! TUN devices: raw IP packets (IFF_TUN | IFF_NO_PI), non-blocking; with `offload`, a
//! virtio-net header before each packet (IFF_VNET_HDR) and TCP segmentation and checksum
//! offloads, so the kernel hands over and takes back 64 KB super-packets (see `gso`).

use bloatlab_lab_model::gso::Write;
use bloatlab_lab_model::vnet::{VnetHdr, VNET_HDR_LEN};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `_IOW('T', 208, unsigned int)`: which offloads the reader accepts.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_VNET_HDR: libc::c_int = 0x4000;
/// TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN (include/uapi/linux/if_tun.h). Not
/// UDP segmentation: datagrams stay one per read, as most senders send them.
const TCP_OFFLOADS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08;
/// Room for the largest super-packet the kernel builds by default (64 KB of IP packet).
pub const READ_BUF: usize = 65_600;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

pub struct Tun {
    fd: OwnedFd,
    pub name: String,
}

impl Tun {
    /// Creates the device `name` in the calling thread's network namespace.
    pub fn create(name: &str, offload: bool) -> io::Result<Tun> {
        if name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name} too long"),
            ));
        }
        // SAFETY: a NUL-terminated path and plain flags.
        let raw = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let vnet = if offload { IFF_VNET_HDR } else { 0 };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI | vnet) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is laid out as.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: TUNSETOFFLOAD takes the flags as its integer argument.
        if offload && unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD as _, TCP_OFFLOADS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tun {
            fd,
            name: name.to_string(),
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// One packet (or super-packet) into `buf`, which is cleared first and needs READ_BUF of
/// capacity; with `vnet`, its virtio header is returned apart. `Ok(None)` when nothing waits.
pub fn read_packet(fd: RawFd, vnet: bool, buf: &mut Vec<u8>) -> io::Result<Option<VnetHdr>> {
    buf.clear();
    debug_assert!(buf.capacity() >= READ_BUF);
    let mut hdr = [0u8; VNET_HDR_LEN];
    let skip = if vnet { VNET_HDR_LEN } else { 0 };
    let iov = [
        libc::iovec {
            iov_base: hdr.as_mut_ptr().cast(),
            iov_len: skip,
        },
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.capacity(),
        },
    ];
    loop {
        // SAFETY: both iovecs point at writable memory of their lengths (the second at the
        // vector's spare capacity); readv writes at most that.
        let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
        if n >= 0 {
            let n = (n as usize).saturating_sub(skip);
            // SAFETY: readv initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(n) };
            return Ok(Some(if vnet {
                VnetHdr::from_bytes(&hdr)
            } else {
                VnetHdr::default()
            }));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Writes one packet or super-packet; the virtio header goes first when `vnet`.
pub fn write_packet(fd: RawFd, vnet: bool, w: &Write) -> io::Result<()> {
    let hdr = w.vnet.to_bytes();
    let payload: &[u8] = w.payload.as_ref().map_or(&[], |(buf, r)| &buf[r.clone()]);
    let iov = [
        libc::iovec {
            iov_base: hdr.as_ptr() as *mut _,
            iov_len: if vnet { VNET_HDR_LEN } else { 0 },
        },
        libc::iovec {
            iov_base: w.head.as_ptr() as *mut _,
            iov_len: w.head.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut _,
            iov_len: payload.len(),
        },
    ];
    // SAFETY: the iovecs point at live, readable memory of their lengths; writev only reads.
    let n = unsafe { libc::writev(fd, iov.as_ptr(), 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout_ns` passed (nanosecond resolution, unlike poll).
pub fn wait_readable(fd: RawFd, timeout_ns: u64) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        // time_t's width differs between C libraries (musl's is deprecated in the libc crate).
        tv_sec: (timeout_ns / 1_000_000_000) as _,
        tv_nsec: (timeout_ns % 1_000_000_000) as _,
    };
    // SAFETY: one valid pollfd and a valid timespec; no signal mask change.
    unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
}
