"""A request's one verdict (``rules.judge``) and what it is judged on: the serving attempt
(``attempts``), the realized hit (usage, or KV chains attributed under concurrency:
``attribution``), what each worker held (``holdings``). The lead collector's verdict job
runs it once per settled request and stores the result; every view reads that."""

from mmlens.analysis.judgement.evidence import Evidence as Evidence
from mmlens.analysis.judgement.evidence import Realized as Realized
from mmlens.analysis.judgement.rules import judge as judge
from mmlens.analysis.judgement.vocabulary import CATEGORIES as CATEGORIES
from mmlens.analysis.judgement.vocabulary import MISSES as MISSES
from mmlens.analysis.judgement.vocabulary import counts as counts
