"""``Client.sample`` with each item's data as its nest.

Reverb's ``Client.sample`` gives the flat list of columns unless the table has a
signature and ``unpack_as_table_signature=True``; tests of tables without one that
check columns by name read the nest through this."""

from shmreplay._schema import item_forms as _item_forms


def sample_nests(client, table, *args, **kwargs):
    unflatten = _item_forms.unflattener(client._engine(table))
    for sample in client.sample(table, *args, **kwargs):
        if isinstance(sample, list):
            yield [step._replace(data=unflatten(step.data)) for step in sample]
        else:
            yield sample._replace(data=unflatten(sample.data))
