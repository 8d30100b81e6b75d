"""One member of a Kafka consumer group, a process of its own so a test can kill -9 it:
librdkafka (confluent-kafka) subscribed to a topic, committing each record's offset
synchronously. It logs `<time> consumed <partition> <offset>` before the commit and
`<time> committed <partition> <offset>` once the commit returned, one line each,
flushed; times are the system's monotonic clock, comparable across processes.

    python group_member.py BOOTSTRAP GROUP TOPIC OUTPUT DELAY_S
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException


def main() -> None:
    bootstrap, group, topic, output, delay = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                         "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range"})
    with open(output, "a", buffering=1) as out:
        def log(*words: object) -> None:
            out.write(f"{time.monotonic():.6f} " + " ".join(str(w) for w in words) + "\n")

        consumer.subscribe([topic], on_assign=lambda c, ps: log("assigned", *(p.partition for p in ps)))
        while True:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            log("consumed", msg.partition(), msg.offset())
            try:
                consumer.commit(message=msg, asynchronous=False)
                log("committed", msg.partition(), msg.offset())
            except KafkaException as exc:  # a rebalance under way: another member reads it again
                log("refused", msg.partition(), msg.offset(), exc.args[0].name())
            time.sleep(delay)


if __name__ == "__main__":
    main()
