//! OTLP/HTTP through the reqwest client the rest of Lacuna uses: opentelemetry-otlp's own is a newer
//! reqwest, which would put a second HTTP stack in the build.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

#[derive(Debug)]
pub(super) struct ReqwestClient(reqwest::Client);

impl ReqwestClient {
    pub(super) fn new(timeout: Duration) -> reqwest::Result<ReqwestClient> {
        reqwest::Client::builder().timeout(timeout).build().map(ReqwestClient)
    }
}

#[async_trait::async_trait]
impl HttpClient for ReqwestClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let response = self.0.execute(request).await?;
        let mut answer = Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            answer = answer.header(name.as_str(), value.as_bytes());
        }
        Ok(answer.body(response.bytes().await?)?)
    }
}
