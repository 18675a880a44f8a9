"""The contract: typed records, enums, metric names, the bucket scheme."""
