# Sourced by scripts/kafka.sh for `start --secure`: one node whose clients connect over SASL_SSL
# with SCRAM-SHA-512 and whose every request passes Apache Kafka's StandardAuthorizer, as a
# production cluster runs; for the security tests and for trying a pipeline's ACL table.
#
# What it makes, in $RUN/tls: a CA of its own (ca.crt, what clients trust), the node's certificate
# for 127.0.0.1 in a PKCS#12 keystore, and $RUN/admin.properties, a Java client configuration for
# the super user `admin` (the admin tools, `acls`). SCRAM users are created when the storage is
# formatted: `admin`, and one for each name of --users, each with the password `<name>-secret`
# (test credentials, for a cluster on loopback that lives as long as a test).
#
# The controller listener stays PLAINTEXT on 127.0.0.1 and its principal, User:ANONYMOUS, is a
# super user: the node's broker half talks to its controller half there. Clients never see it.

STORE_PASSWORD=lacuna-test

secure_material() {
    local tls="$RUN/tls"
    mkdir -p "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=lacuna-test-ca" \
        -keyout "$tls/ca.key" -out "$tls/ca.crt" 2> "$tls/openssl.log" ||
        { cat "$tls/openssl.log" >&2; die "openssl could not make the test CA"; }
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$tls/node.key" -out "$tls/node.csr" 2>> "$tls/openssl.log"
    # librdkafka checks the broker's name against the certificate (ssl.endpoint.identification.algorithm
    # https, its default): the address clients dial must be in the subject alternative names.
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$tls/san.ext"
    openssl x509 -req -in "$tls/node.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
        -extfile "$tls/san.ext" -out "$tls/node.crt" 2>> "$tls/openssl.log" ||
        { cat "$tls/openssl.log" >&2; die "openssl could not sign the node's certificate"; }
    openssl pkcs12 -export -in "$tls/node.crt" -inkey "$tls/node.key" -certfile "$tls/ca.crt" \
        -name node -passout "pass:$STORE_PASSWORD" -out "$tls/node.p12" 2>> "$tls/openssl.log" ||
        { cat "$tls/openssl.log" >&2; die "openssl could not write the node's keystore"; }
    cat > "$RUN/admin.properties" <<EOF
bootstrap.servers=127.0.0.1:$PORT
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.crt
EOF
    touch "$RUN/secure"
}

# The listeners and the authorizer, in place of write_config's PLAINTEXT ones.
secure_config() {
    local tls="$RUN/tls"
    cat <<EOF
listeners=SASL_SSL://127.0.0.1:$(client_port 1),CONTROLLER://127.0.0.1:$(controller_port 1)
advertised.listeners=SASL_SSL://127.0.0.1:$(client_port 1)
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls/node.p12
ssl.keystore.password=$STORE_PASSWORD
ssl.key.password=$STORE_PASSWORD
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.crt
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false
EOF
}

# The storage tool's arguments that create the SCRAM users before the node first starts.
secure_users() {
    local user
    printf '%s\n' --add-scram "SCRAM-SHA-512=[name=admin,password=admin-secret]"
    for user in ${USERS//,/ }; do
        printf '%s\n' --add-scram "SCRAM-SHA-512=[name=$user,password=$user-secret]"
    done
}

# The client configuration that the admin tools take, when the cluster is a secure one, one
# argument a line.
admin_config() {
    if [ -f "$RUN/secure" ]; then printf '%s\n' --command-config "$RUN/admin.properties"; fi
}
