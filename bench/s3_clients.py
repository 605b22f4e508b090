"""Measure S3 client libraries against one S3 server: what chose boto3 (docs/REMOTES.md).

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
        python bench/s3_clients.py --endpoint http://127.0.0.1:8333 --bucket bench

Run it with a Python that has the clients to compare (boto3 is ags's own;
``obstore`` and ``aiobotocore`` are measured when they import, else shown as
a dash). Per client: the import (and first client) time in a fresh
interpreter, the median latency of a small conditional PUT
(``If-None-Match: *``), GET and HEAD, listing 1,000 keys, 1,000 small PUTs
from 16 threads (or tasks), and one 8 MiB PUT and GET.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SMALL = os.urandom(2000)
BIG = os.urandom(8 << 20)
N = 200


def median_ms(op: Callable[[int], Any], n: int = N) -> float:
    times = []
    for i in range(n):
        start = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def import_seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def bench_boto3(endpoint: str, bucket: str, run: str) -> dict[str, float]:
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(
            retries={"mode": "standard"},
            max_pool_connections=16,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    p = f"boto3/{run}/"
    out = {
        "import": import_seconds(
            "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:1', "
            "region_name='us-east-1')"
        ),
        "put": median_ms(
            lambda i: s3.put_object(Bucket=bucket, Key=f"{p}{i}", Body=SMALL, IfNoneMatch="*")
        ),  # fmt: skip
        "get": median_ms(lambda i: s3.get_object(Bucket=bucket, Key=f"{p}{i}")["Body"].read()),
        "head": median_ms(lambda i: s3.head_object(Bucket=bucket, Key=f"{p}{i}")),
    }
    with ThreadPoolExecutor(16) as pool:
        start = time.perf_counter()
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"{p}par/{i}", Body=SMALL,
                                              IfNoneMatch="*"), range(1000)))  # fmt: skip
        out["1000 puts"] = time.perf_counter() - start

    def listing(_: int) -> None:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{p}par/")
        assert sum(len(page.get("Contents", [])) for page in pages) == 1000

    out["list 1000"] = median_ms(listing, 5)
    out["8 MiB put"] = median_ms(
        lambda i: s3.put_object(Bucket=bucket, Key=f"{p}big{i}", Body=BIG, IfNoneMatch="*"), 3
    )
    out["8 MiB get"] = median_ms(
        lambda i: s3.get_object(Bucket=bucket, Key=f"{p}big{i}")["Body"].read(), 3
    )
    return out


def bench_obstore(endpoint: str, bucket: str, run: str) -> dict[str, float]:
    import obstore as obs  # type: ignore[import-not-found]
    from obstore.store import S3Store  # type: ignore[import-not-found]

    st = S3Store(bucket, prefix=f"obstore/{run}", config={"endpoint": endpoint},
                 client_options={"allow_http": True})  # fmt: skip
    out = {
        "import": import_seconds(
            "from obstore.store import S3Store; S3Store('b', config={'endpoint': "
            "'http://127.0.0.1:1', 'region': 'us-east-1'}, client_options={'allow_http': True})"
        ),
        "put": median_ms(lambda i: obs.put(st, f"{i}", SMALL, mode="create")),
        "get": median_ms(lambda i: bytes(obs.get(st, f"{i}").bytes())),
        "head": median_ms(lambda i: obs.head(st, f"{i}")),
    }
    with ThreadPoolExecutor(16) as pool:
        start = time.perf_counter()
        list(pool.map(lambda i: obs.put(st, f"par/{i}", SMALL, mode="create"), range(1000)))
        out["1000 puts"] = time.perf_counter() - start

    def listing(_: int) -> None:
        assert sum(len(batch) for batch in obs.list(st, "par/", chunk_size=1000)) == 1000

    out["list 1000"] = median_ms(listing, 5)
    out["8 MiB put"] = median_ms(lambda i: obs.put(st, f"big{i}", BIG, mode="create"), 3)
    out["8 MiB get"] = median_ms(lambda i: bytes(obs.get(st, f"big{i}").bytes()), 3)
    return out


def bench_aiobotocore(endpoint: str, bucket: str, run: str) -> dict[str, float]:
    from aiobotocore.session import get_session  # type: ignore[import-not-found]
    from botocore.config import Config

    async def main() -> dict[str, float]:
        out: dict[str, float] = {"import": import_seconds(
            "from aiobotocore.session import get_session; get_session()"
        )}  # fmt: skip
        config = Config(max_pool_connections=16, request_checksum_calculation="when_required")
        async with get_session().create_client("s3", endpoint_url=endpoint, config=config) as c:
            p = f"aiobotocore/{run}/"

            async def timed(op: Callable[[int], Any]) -> float:
                times = []
                for i in range(N):
                    start = time.perf_counter()
                    await op(i)
                    times.append(time.perf_counter() - start)
                return statistics.median(times) * 1e3

            def put(i: int) -> Any:
                return c.put_object(Bucket=bucket, Key=f"{p}{i}", Body=SMALL, IfNoneMatch="*")

            out["put"] = await timed(put)

            async def get(i: int) -> None:
                reply = await c.get_object(Bucket=bucket, Key=f"{p}{i}")
                await reply["Body"].read()

            out["get"] = await timed(get)
            out["head"] = await timed(lambda i: c.head_object(Bucket=bucket, Key=f"{p}{i}"))
            gate = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                async with gate:
                    await c.put_object(Bucket=bucket, Key=f"{p}par/{i}", Body=SMALL,
                                       IfNoneMatch="*")  # fmt: skip

            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(1000)))
            out["1000 puts"] = time.perf_counter() - start
        return out

    return asyncio.run(main())


COLUMNS = ("import", "put", "get", "head", "list 1000", "1000 puts", "8 MiB put", "8 MiB get")
UNITS = {"import": "s", "1000 puts": "s"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    args = parser.parse_args()
    run = os.urandom(4).hex()
    print(f"{'client':12}" + "".join(f"{c + ' (' + UNITS.get(c, 'ms') + ')':>16}" for c in COLUMNS))
    for name, bench in (("boto3", bench_boto3), ("obstore", bench_obstore),
                        ("aiobotocore", bench_aiobotocore)):  # fmt: skip
        try:
            row = bench(args.endpoint, args.bucket, run)
        except ImportError:
            row = {}
        cells = (f"{row[c]:>16.2f}" if c in row else f"{'-':>16}" for c in COLUMNS)
        print(f"{name:12}" + "".join(cells))


if __name__ == "__main__":
    main()
