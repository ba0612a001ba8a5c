"""Results out over ZeroMQ: the publisher, its wire protocol and CURVE security.

See docs/protocol.md; subscribers use `streamer.publish.client`.
"""

from streamer.publish.frequencies import FrequencyTable
from streamer.publish.protocol import CALL_COLUMNS, FREQ_COLUMNS, SCHEMA_VERSION, Categorical, ProtocolError, Topic
from streamer.publish.publisher import Publisher, PublisherConfig, PublisherStats
from streamer.publish.security import CurveClient, CurveServer, KeyPair

__all__ = [
    "CALL_COLUMNS", "FREQ_COLUMNS", "SCHEMA_VERSION", "Categorical", "CurveClient", "CurveServer",
    "FrequencyTable", "KeyPair", "ProtocolError", "Publisher", "PublisherConfig", "PublisherStats", "Topic",
]
