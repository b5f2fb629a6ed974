# Sourced by entrypoint.sh: gRPC over TLS from PEM files mounted in /etc/trainserve/tls ($TRAINSERVE_TLS_DIR), the key
# names of a Kubernetes Secret of type kubernetes.io/tls plus ca.crt (compose mounts `make certs` output there):
#   tls.crt  the server's certificate (chain, leaf first)      tls.key  its private key (unencrypted)
#   ca.crt   optional: the CA that signs CLIENT certificates; with it, every client must present one (mutual TLS)
# TF Serving takes neither paths nor flags for these: --ssl_config_file names an SSLConfig text proto
# (tensorflow_serving/config/ssl_config.proto) holding the PEM CONTENTS, written here at start. TF Serving
# reads it once: a renewed certificate is served after a restart (k8s: a rolling update).
# TLS covers the gRPC port only; the REST port (healthcheck.sh, Prometheus) stays plaintext, as in TF Serving.
TLS_DIR=${TRAINSERVE_TLS_DIR:-/etc/trainserve/tls}
SSL_CONFIG=${TRAINSERVE_RUN_DIR:-/tmp/trainserve}/ssl.config

# text_proto_string FILE: the file's contents as one text-format string literal (C escapes), on stdout.
text_proto_string() {
  local value
  value=$(<"$1")$'\n' # $(<) drops the final newline; PEM ends with one
  value=${value//\\/\\\\}
  value=${value//\"/\\\"}
  value=${value//$'\r'/}
  printf '"%s"' "${value//$'\n'/\\n}"
}

# ssl_config: with tls.crt or tls.key mounted, write $SSL_CONFIG and print its path; print nothing without
# either (plaintext, as before). A half-mounted Secret is an error, not a silent plaintext start.
# TLS_CLIENT_VERIFY (default: true when ca.crt is mounted) requires client certificates.
ssl_config() {
  [[ -e "$TLS_DIR/tls.crt" || -e "$TLS_DIR/tls.key" ]] || return 0
  local file
  for file in tls.crt tls.key; do
    [[ -r "$TLS_DIR/$file" ]] || fail "TLS: $TLS_DIR/$file is missing or unreadable: expected tls.crt and tls.key (PEM)"
  done
  local verify=${TLS_CLIENT_VERIFY:-$([[ -e "$TLS_DIR/ca.crt" ]] && echo true || echo false)}
  [[ "$verify" == true || "$verify" == false ]] || fail "TLS_CLIENT_VERIFY '$verify': expected true or false"
  if [[ "$verify" == true && ! -r "$TLS_DIR/ca.crt" ]]; then
    fail "TLS_CLIENT_VERIFY=true needs $TLS_DIR/ca.crt: expected the CA that signs client certificates"
  fi
  mkdir -p "${SSL_CONFIG%/*}" 2>/dev/null || true
  (
    umask 077 # the file holds the private key
    {
      echo "# SSLConfig written by serve-cpu's entrypoint from $TLS_DIR at start"
      echo "server_cert: $(text_proto_string "$TLS_DIR/tls.crt")"
      echo "server_key: $(text_proto_string "$TLS_DIR/tls.key")"
      [[ "$verify" == false ]] || echo "custom_ca: $(text_proto_string "$TLS_DIR/ca.crt")"
      echo "client_verify: $verify"
    } >"$SSL_CONFIG"
  ) 2>/dev/null || fail "cannot write $SSL_CONFIG: give the container a writable /tmp"
  echo "$SSL_CONFIG"
}
