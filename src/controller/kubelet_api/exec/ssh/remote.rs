//! What the network bridge asks of a connection besides exec and port-forward: remote forwards
//! (`ssh -R` to the pod's loopback) and short commands that leave the connection open.

use russh::ChannelMsg;

use super::{CONNECT_TIMEOUT, Session, SshError};

impl Session {
    /// Asks the pod's sshd to listen on `address:port` inside the pod and send each connection
    /// back on this connection (an `ssh -R`).
    pub async fn remote_forward(&mut self, address: &str, port: u16) -> Result<(), SshError> {
        let asked = self.handle.tcpip_forward(address, u32::from(port));
        match tokio::time::timeout(CONNECT_TIMEOUT, asked).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(SshError::Protocol(format!(
                "listening on {address}:{port} in the pod: {error}"
            ))),
            Err(_) => Err(SshError::Protocol(format!(
                "listening on {address}:{port} in the pod: no answer within {CONNECT_TIMEOUT:?}"
            ))),
        }
    }

    /// Stops a remote forward (connections already made stay).
    pub async fn cancel_remote_forward(&self, address: &str, port: u16) -> Result<(), SshError> {
        let asked = self.handle.cancel_tcpip_forward(address, u32::from(port));
        match tokio::time::timeout(CONNECT_TIMEOUT, asked).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(SshError::Protocol(format!(
                "stopping {address}:{port} in the pod: {error}"
            ))),
            Err(_) => Err(SshError::Protocol(format!(
                "stopping {address}:{port} in the pod: no answer within {CONNECT_TIMEOUT:?}"
            ))),
        }
    }

    /// Runs a short shell command in the pod on this connection (it stays open); its exit
    /// status, or why there is none.
    pub async fn run(&self, command: &str) -> Result<u32, SshError> {
        self.output(command).await.map(|(code, _)| code)
    }

    /// Runs a short shell command in the pod and keeps what it prints (up to 1 MiB).
    pub async fn output(&self, command: &str) -> Result<(u32, Vec<u8>), SshError> {
        self.output_within(command, CONNECT_TIMEOUT).await
    }

    /// [`Session::output`] for a command that may take up to `limit` (a hook within the pod's
    /// grace period).
    pub async fn output_within(
        &self,
        command: &str,
        limit: std::time::Duration,
    ) -> Result<(u32, Vec<u8>), SshError> {
        const MAX: usize = 1 << 20;
        let running = async {
            let mut channel = self
                .handle
                .channel_open_session()
                .await
                .map_err(|e| e.to_string())?;
            channel
                .exec(true, command)
                .await
                .map_err(|e| e.to_string())?;
            let mut code = None;
            let mut out = Vec::new();
            while let Some(message) = channel.wait().await {
                match message {
                    ChannelMsg::Data { data } if out.len() < MAX => {
                        out.extend_from_slice(&data[..data.len().min(MAX - out.len())]);
                    }
                    ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
                    ChannelMsg::Failure => {
                        return Err("the pod's SSH server refused to run it".to_owned());
                    }
                    ChannelMsg::Close => break,
                    _ => {}
                }
            }
            code.map(|code| (code, out))
                .ok_or_else(|| "no exit status".to_owned())
        };
        match tokio::time::timeout(limit, running).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(reason)) => Err(SshError::Protocol(reason)),
            Err(_) => Err(SshError::Protocol(format!(
                "the command did not end within {limit:?}"
            ))),
        }
    }

    /// Ends the connection (its remote forwards and channels with it).
    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }
}
