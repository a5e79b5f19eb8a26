"""One batch adapter per provider API; see ``base`` for the extension point."""

from conductor.execution.batch.adapters.base import (
                                                     BatchAdapter,
                                                     BatchCompletion,
                                                     BatchRequest,
                                                     Outcome,
                                                     Poll,
                                                     adapter_class,
                                                     group_key,
                                                     register_batch_adapter,
)

__all__ = ["BatchAdapter", "BatchCompletion", "BatchRequest", "Outcome", "Poll", "adapter_class", "group_key",
           "register_batch_adapter"]
