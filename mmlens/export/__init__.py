"""What mmlens exports to the tools engineers already watch: Prometheus metric families built
from the store's answers (``families``), and the Grafana dashboards over them (``grafana``)."""
