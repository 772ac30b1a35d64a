//! The seal key's Secret in the operator's namespace: read it, or make it once for every replica.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::error::Error;
use crate::model::seal::{KEY_BYTES, SealKey};

/// The Secret's key that holds the seal key's bytes.
pub const SECRET_KEY: &str = "key";

/// The seal key in Secret `namespace/name`; the first replica to find none makes it (another
/// that makes one at the same time reads the winner's).
pub async fn load_or_create(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<SealKey, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("the seal key Secret {namespace}/{name}");
    for _ in 0..2 {
        if let Some(secret) = secrets
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("reading {what}")))?
        {
            return key_of(&secret).ok_or_else(|| {
                Error::SealKey(format!(
                    "{what} has no {SECRET_KEY:?} of at least {KEY_BYTES} bytes: delete it and the \
                 operator makes a new one (worker pods sealed with the old key then stop \
                 reporting until they are replaced)"
                ))
            });
        }
        let bytes =
            SealKey::generate().map_err(|_| Error::SealKey("no system randomness".to_owned()))?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "trainyard-operator".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                SECRET_KEY.to_owned(),
                ByteString(bytes.to_vec()),
            )])),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(made) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "made the seal key");
                return key_of(&made)
                    .ok_or_else(|| Error::SealKey(format!("{what} came back empty")));
            }
            // Another replica made it first: read that one.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(Error::kube(format!("creating {what}"))(e)),
        }
    }
    Err(Error::SealKey(format!(
        "{what} was neither readable nor creatable"
    )))
}

/// The key a Secret holds, made when the Secret was.
fn key_of(secret: &Secret) -> Option<SealKey> {
    let bytes = &secret.data.as_ref()?.get(SECRET_KEY)?.0;
    let made = secret.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (bytes.len() >= KEY_BYTES).then(|| SealKey::new(bytes, made))
}
