# The outbox-cdc connector. Build: docker build -t outbox-cdc .
# (docker-compose.yml builds and runs it next to PostgreSQL and Kafka.)

FROM rust:1-bookworm AS build
# librdkafka is built from source by rdkafka's cmake-build feature, with OpenSSL.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake pkg-config libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin outbox-cdc \
    && cp target/release/outbox-cdc /usr/local/bin/outbox-cdc

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/outbox-cdc \
        --shell /usr/sbin/nologin outbox-cdc \
    && mkdir -p /var/lib/outbox-cdc /etc/outbox-cdc \
    && chown outbox-cdc:outbox-cdc /var/lib/outbox-cdc
COPY --from=build /usr/local/bin/outbox-cdc /usr/local/bin/outbox-cdc
USER outbox-cdc
WORKDIR /var/lib/outbox-cdc
# The acknowledged-LSN store lives here; mount a volume to keep it.
VOLUME ["/var/lib/outbox-cdc"]
EXPOSE 9187
ENTRYPOINT ["outbox-cdc"]
CMD ["run", "--config", "/etc/outbox-cdc/config.toml"]
