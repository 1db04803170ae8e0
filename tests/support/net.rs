//! Plain TCP stand-ins for a pod's container port, shared by the exec and network tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A server standing for the pod's container port (the pod's loopback, in the simulator): it
/// answers each read in upper case. Returns its port.
pub fn upper_echo() -> anyhow::Result<u16> {
    let server = TcpListener::bind("127.0.0.1:0")?;
    let port = server.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in server.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n].to_ascii_uppercase()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// Sends `text` to `address` and reads the answer.
pub fn echo(address: SocketAddr, text: &str) -> anyhow::Result<String> {
    let mut conn = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(text.as_bytes())?;
    let mut buf = [0u8; 256];
    let n = conn.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
