//! A remote forward of the pod's sshd: each connection to its listener goes back to the SSH
//! client as a `forwarded-tcpip` channel.

use russh::server::Handle;
use tokio::net::TcpListener;

/// Serves `listener` (bound at `address:port` in the pod) until aborted.
pub(crate) fn serve(
    listener: TcpListener,
    address: String,
    port: u16,
    handle: Handle,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut tcp, peer)) = listener.accept().await {
            let handle = handle.clone();
            let connected = address.clone();
            tokio::spawn(async move {
                let opened = handle
                    .channel_open_forwarded_tcpip(
                        connected,
                        u32::from(port),
                        peer.ip().to_string(),
                        u32::from(peer.port()),
                    )
                    .await;
                if let Ok(channel) = opened {
                    let mut stream = channel.into_stream();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await;
                }
            });
        }
    })
}
