"""A producer or consumer in its own process, to be killed by the event log's tests.

``produce``: appends decisions ``start..start+count``, flushing every ``--ack-every`` and
printing ``{"acked": n}`` after each flush; then prints ``{"done": n}`` and waits for a
signal. SIGTERM closes the producer (which delivers what is left) and exits.

With ``--journal write``, the producer is a journal: each append is on disk when it returns,
and the worker prints ``{"appended": n}`` every ``--report-every`` appends (paced at
``--rate`` per second), for a test to kill it mid-delivery.

``consume``: polls and, per batch, appends the event ids to ``--out`` (the "apply") and then
commits; once ``--stop-after`` ids are applied it polls one more batch, applies it without
committing, prints ``{"stuck": n}`` and sleeps, waiting to be killed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from types import FrameType

from services.eventlog import EventLogSettings, open_consumer, open_producer
from tests.integration.eventlog.sample import decision, event_id


def say(**message: int) -> None:
    print(json.dumps(message), flush=True)


def produce(
    settings: EventLogSettings,
    start: int,
    count: int,
    ack_every: int,
    journal: str = "off",
    rate: float = 0.0,
    report_every: int = 0,
) -> None:
    producer = open_producer(settings, journal=journal)  # type: ignore[arg-type]

    def stop(_sig: int, _frame: FrameType | None) -> None:
        producer.close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    began = time.monotonic()
    for i in range(start, start + count):
        if rate > 0:
            time.sleep(max(0.0, began + (i - start) / rate - time.monotonic()))
        producer.append(decision(i))
        if report_every and (i - start + 1) % report_every == 0:
            say(appended=i - start + 1)
        if ack_every and (i - start + 1) % ack_every == 0:
            producer.flush()
            say(acked=i - start + 1)
    say(done=count)
    while True:  # until SIGTERM (or SIGKILL)
        signal.pause()


def consume(settings: EventLogSettings, group: str, out: str, stop_after: int) -> None:
    consumer = open_consumer(settings, group)
    applied = 0
    with open(out, "a") as f:
        while True:
            records = consumer.poll(50, 1.0)
            if not records:
                continue
            f.write("".join(event_id(r) + "\n" for r in records))
            f.flush()
            applied += len(records)
            if applied > stop_after:
                say(stuck=applied)
                while True:
                    time.sleep(60)
            consumer.commit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settings", required=True)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--ack-every", type=int, default=0)
    p.add_argument("--journal", choices=("off", "write", "fsync"), default="off")
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--report-every", type=int, default=0)
    c = sub.add_parser("consume")
    c.add_argument("--group", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--stop-after", type=int, required=True)
    args = parser.parse_args()
    settings = EventLogSettings.model_validate_json(args.settings)
    if args.mode == "produce":
        produce(
            settings,
            args.start,
            args.count,
            args.ack_every,
            args.journal,
            args.rate,
            args.report_every,
        )
    else:
        consume(settings, args.group, args.out, args.stop_after)


if __name__ == "__main__":
    main()
