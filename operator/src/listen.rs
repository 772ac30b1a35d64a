//! The operator's HTTP listeners (metrics and health, the progress channel): bind, then serve
//! a router until shutdown.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;

use crate::error::Error;

/// Binds `addr` for the `what` server; the returned future serves `app` until `shutdown`
/// completes. Returns the bound address (port 0 picks one).
pub async fn serve(
    what: &'static str,
    addr: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = std::io::Result<()>>), Error> {
    let failed = |source| Error::Listen { what, addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
    let local = listener.local_addr().map_err(failed)?;
    let serving = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    Ok((local, async move { serving.await }))
}
