"""Typed records the collectors produce and the store, snapshot and pages consume.

Plain dataclasses: they cross the collector → store → page boundary and must stay cheap to
build (KV events arrive at hundreds of thousands of blocks per second). Defined by kind in
``kv`` (KV events), ``traces`` (requests, routing decisions, availability) and ``telemetry``
(metrics, router state, spans, collector health); every caller imports them from here.
"""

from mmlens.layout.expected import ExpectedLayout as ExpectedLayout
from mmlens.layout.expected import LayoutImage as LayoutImage
from mmlens.layout.expected import LayoutPart as LayoutPart
from mmlens.layout.expected import LayoutSpan as LayoutSpan
from mmlens.layout.expected import ViewCount as ViewCount
from mmlens.records.kv import AllBlocksCleared as AllBlocksCleared
from mmlens.records.kv import BlockHash as BlockHash
from mmlens.records.kv import BlockRemoved as BlockRemoved
from mmlens.records.kv import BlockStored as BlockStored
from mmlens.records.kv import ImageRef as ImageRef
from mmlens.records.kv import KVEvent as KVEvent
from mmlens.records.kv import KVEventRow as KVEventRow
from mmlens.records.kv import ResidentSummary as ResidentSummary
from mmlens.records.telemetry import CollectorHealth as CollectorHealth
from mmlens.records.telemetry import ErrorCounts as ErrorCounts
from mmlens.records.telemetry import Flavor as Flavor
from mmlens.records.telemetry import Labels as Labels
from mmlens.records.telemetry import MetricSample as MetricSample
from mmlens.records.telemetry import RouterWorker as RouterWorker
from mmlens.records.telemetry import SpanEvent as SpanEvent
from mmlens.records.telemetry import SpanRecord as SpanRecord
from mmlens.records.telemetry import WorkerLoad as WorkerLoad
from mmlens.records.telemetry import WorkerMinute as WorkerMinute
from mmlens.records.telemetry import count_error as count_error
from mmlens.records.telemetry import labels_of as labels_of
from mmlens.records.traces import Availability as Availability
from mmlens.records.traces import ImageInfo as ImageInfo
from mmlens.records.traces import RequestTrace as RequestTrace
from mmlens.records.traces import RoutingCandidate as RoutingCandidate
from mmlens.records.traces import RoutingDecision as RoutingDecision
from mmlens.records.traces import RoutingScore as RoutingScore
from mmlens.records.traces import SpillGate as SpillGate
from mmlens.records.verdict import Verdict as Verdict
