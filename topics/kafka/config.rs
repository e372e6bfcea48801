//! The librdkafka configuration every Kafka client of a process starts from: the brokers, the
//! user's `kafka.properties` (TLS, SASL, timeouts: any librdkafka property) and the secret ones,
//! whose values come from environment variables named in `kafka.secret_properties` (a Kubernetes
//! Secret in the chart), so that no secret sits in a config file or a ConfigMap.

use rdkafka::config::ClientConfig;

use crate::config::KafkaSettings;
use crate::topics::bus::BusError;

/// Properties that hold secrets. librdkafka never logs their values; we refuse them in
/// `kafka.properties`, where they would sit in plain text.
const SECRET_PROPERTIES: [&str; 8] = [
    "sasl.password",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase",
];

/// librdkafka's second names for properties checked here (its CONFIGURATION.md, "alias for"): a
/// property is checked under its canonical name, so that the other cannot get around the check,
/// and two names for one property cannot both be set with either value winning.
const ALIASES: [(&str, &str); 5] = [
    ("metadata.broker.list", "bootstrap.servers"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("auto.commit.enable", "enable.auto.commit"),
    ("request.required.acks", "acks"),
    ("sasl.oauthbearer.client.credentials.client.secret", "sasl.oauthbearer.client.secret"),
];

/// The name librdkafka knows `key` by.
fn canonical(key: &str) -> &str {
    ALIASES.iter().find(|(alias, _)| *alias == key).map_or(key, |(_, name)| name)
}

/// Properties Lacuna sets itself, and what governs each instead. Set in `kafka.properties` they
/// would be overridden without a word, or, for the delivery ones, break what Lacuna promises
/// (offsets stored only once a record is done, idempotent acknowledged publishes).
const OWN_PROPERTIES: [(&str, &str); 20] = [
    ("bootstrap.servers", "kafka.brokers"),
    ("group.id", "kafka.topic_prefix"),
    ("group.instance.id", "kafka.instance_id"),
    ("session.timeout.ms", "kafka.session_timeout_ms"),
    ("max.poll.interval.ms", "kafka.max_poll_interval_ms"),
    ("message.timeout.ms", "kafka.message_timeout_ms"),
    ("message.max.bytes", "bus.max_event_bytes"),
    ("enable.auto.commit", "Lacuna's offset tracking"),
    ("enable.auto.offset.store", "Lacuna's offset tracking"),
    ("auto.commit.interval.ms", "Lacuna's offset tracking"),
    ("auto.offset.reset", "Lacuna's offset tracking"),
    ("enable.partition.eof", "Lacuna's offset tracking"),
    ("enable.idempotence", "Lacuna's delivery guarantees"),
    ("acks", "Lacuna's delivery guarantees"),
    ("transactional.id", "bus.delivery"),
    ("transaction.timeout.ms", "kafka.transaction_timeout_ms"),
    ("isolation.level", "bus.delivery"),
    ("statistics.interval.ms", "the consumer-lag metric"),
    ("group.protocol", CONSUMER_PROTOCOL),
    ("partition.assignment.strategy", CONSUMER_PROTOCOL),
];

/// The group protocol and assignor every group consumer runs, which its rebalance handling (a
/// revocation drains and commits only the partitions that move) and the rebalance tests are built
/// for; no other is supported. KIP-848's `consumer` protocol moves assignment to the broker and
/// refuses `session.timeout.ms`.
const CONSUMER_PROTOCOL: &str =
    "the one protocol Lacuna supports (classic, with the cooperative-sticky assignor: docs/kafka.md#rebalances)";

/// The base configuration of every client (producer, consumers, admin): errors name the property
/// and the environment variable, never a secret's value.
pub fn client_config(settings: &KafkaSettings) -> Result<ClientConfig, BusError> {
    let refuse = |message: String| Err(BusError::Config(message));
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    for (written, value) in pairs("kafka.properties", &settings.properties)? {
        let key = canonical(written);
        let named = if key == written { format!("\"{key}\"") } else { format!("\"{written}\" (librdkafka's {key})") };
        if SECRET_PROPERTIES.contains(&key) {
            return refuse(format!(
                "kafka.properties.{named} holds a secret: name an environment variable holding it in kafka.secret_properties instead"
            ));
        }
        if let Some((_, instead)) = OWN_PROPERTIES.iter().find(|(own, _)| *own == key) {
            return refuse(format!("kafka.properties.{named} is set by Lacuna: {instead} governs it"));
        }
        config.set(key, value);
    }
    for (key, variable) in pairs("kafka.secret_properties", &settings.secret_properties)? {
        let key = canonical(key);
        match std::env::var(variable) {
            Ok(value) if !value.is_empty() => {
                config.set(key, value);
            }
            _ => {
                return refuse(format!(
                    "kafka.secret_properties.\"{key}\": the environment variable {variable} is not set"
                ));
            }
        }
    }
    Ok(config)
}

/// `property=value` entries as pairs. The value is not echoed in the error: it may be a secret.
fn pairs<'a>(setting: &str, entries: &'a [String]) -> Result<Vec<(&'a str, &'a str)>, BusError> {
    entries
        .iter()
        .enumerate()
        .map(|(n, entry)| match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim(), value.trim())),
            _ => Err(BusError::Config(format!("{setting}[{n}] is not \"property=value\""))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::BaseConsumer;

    use super::*;

    fn settings(properties: &[(&str, &str)], secrets: &[(&str, &str)]) -> KafkaSettings {
        let list = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        KafkaSettings {
            properties: list(properties),
            secret_properties: list(secrets),
            ..crate::config::Settings::defaults().kafka
        }
    }

    #[test]
    fn properties_and_secrets_reach_a_tls_sasl_client() {
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("LACUNA_TEST_KAFKA_PASSWORD", "s3cret-value") };
        let settings = settings(
            &[("security.protocol", "SASL_SSL"), ("sasl.mechanisms", "SCRAM-SHA-512"), ("sasl.username", "lacuna")],
            &[("sasl.password", "LACUNA_TEST_KAFKA_PASSWORD")],
        );
        let mut config = client_config(&settings).unwrap();
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(config.get("sasl.username"), Some("lacuna"));
        assert_eq!(config.get("sasl.password"), Some("s3cret-value"));
        // librdkafka accepts them: it was built with TLS and SCRAM (creating a client does not connect).
        let _client: BaseConsumer = config.set("group.id", "t").create().expect("a SASL_SSL client");
    }

    #[test]
    fn a_secret_in_plain_properties_or_a_missing_variable_is_refused_without_echoing_values() {
        let error = client_config(&settings(&[("sasl.password", "plain-text-pw")], &[])).unwrap_err().to_string();
        assert!(error.contains("kafka.secret_properties") && !error.contains("plain-text-pw"), "{error}");
        let error =
            client_config(&settings(&[], &[("sasl.password", "LACUNA_TEST_UNSET_VARIABLE")])).unwrap_err().to_string();
        assert!(error.contains("LACUNA_TEST_UNSET_VARIABLE is not set"), "{error}");
        let error = client_config(&settings(&[("group.id", "mine")], &[])).unwrap_err().to_string();
        assert!(error.contains("set by Lacuna"), "{error}");
        // Auto-commit would commit records before they are done: a crash would then lose them.
        let error = client_config(&settings(&[("enable.auto.offset.store", "true")], &[])).unwrap_err().to_string();
        assert!(error.contains("set by Lacuna") && error.contains("offset tracking"), "{error}");
        let error = client_config(&settings(&[("session.timeout.ms", "45000")], &[])).unwrap_err().to_string();
        assert!(error.contains("kafka.session_timeout_ms governs it"), "{error}");
        let malformed = KafkaSettings { properties: vec!["sasl.password".into()], ..settings(&[], &[]) };
        let error = client_config(&malformed).unwrap_err().to_string();
        assert!(error.contains("kafka.properties[0] is not"), "{error}");
    }

    /// Lacuna's consumers run one group protocol and one assignor, the ones its rebalance handling
    /// and tests are built for: the classic protocol with cooperative-sticky. KIP-848's protocol
    /// (`group.protocol=consumer`) or another assignor set in kafka.properties is refused with a
    /// message that says so (issue 74).
    #[test]
    fn another_group_protocol_or_assignor_is_refused_with_the_one_lacuna_runs() {
        for (key, value) in [("group.protocol", "consumer"), ("partition.assignment.strategy", "range,roundrobin")] {
            let error = client_config(&settings(&[(key, value)], &[])).unwrap_err().to_string();
            assert!(error.contains("cooperative-sticky") && error.contains("classic"), "{key}: {error}");
        }
    }

    /// librdkafka takes some properties under a second name: refusing the canonical name alone let
    /// the other through, and a secret reach a ConfigMap.
    #[test]
    fn a_refused_property_is_refused_under_its_librdkafka_alias_too() {
        let refused = |key: &str| {
            let outcome = client_config(&settings(&[(key, "x")], &[]));
            assert!(outcome.is_err(), "kafka.properties.\"{key}\" was accepted");
            outcome.err().map(|e| e.to_string()).unwrap_or_default()
        };
        for (alias, canonical) in [
            ("metadata.broker.list", "bootstrap.servers"),
            ("delivery.timeout.ms", "message.timeout.ms"),
            ("auto.commit.enable", "enable.auto.commit"),
            ("request.required.acks", "acks"),
        ] {
            let error = refused(alias);
            assert!(error.contains("set by Lacuna") && error.contains(canonical), "{alias}: {error}");
        }
        for secret in [
            "sasl.oauthbearer.client.credentials.client.secret",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.oauthbearer.assertion.private.key.passphrase",
        ] {
            let error = refused(secret);
            assert!(error.contains("kafka.secret_properties") && !error.contains("=x"), "{secret}: {error}");
        }
    }

    #[test]
    fn an_unknown_property_fails_when_the_client_is_created() {
        let mut config = client_config(&settings(&[("no.such.property", "1")], &[])).unwrap();
        let created: Result<BaseConsumer, _> = config.set("group.id", "t").create();
        let error = created.err().expect("librdkafka refuses an unknown property").to_string();
        assert!(error.contains("no.such.property"), "{error}");
    }
}
