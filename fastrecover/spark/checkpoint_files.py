"""A query's checkpoint as files: read, written whole and once, deleted, listed by batch id.

The formats of the files are in :mod:`fastrecover.spark.checkpoint`; this module
only moves their text, through Hadoop's FileSystem in the driver's JVM, so a
checkpoint on local disk, HDFS or an object store is edited alike.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from fastrecover.errors import CheckpointError
from fastrecover.spark.driver_jvm import jvm_view

log = logging.getLogger("fastrecover.spark")


class CheckpointFiles:
    """The checkpoint's files through Hadoop's FileSystem (local, HDFS, object stores alike).

    Every call here is a round trip to the JVM, on the path from ``start_kafka_stream`` to the first fresh
    record: classes are looked up once (in a JVM view of their own), and a listing costs two calls per
    file (Spark keeps 100 batches in each log by default: about 50 ms), so a restart lists one directory
    of Spark's, the offset log, and probes single files elsewhere.
    """

    def __init__(self, spark: Any, location: str) -> None:
        self._jvm = jvm_view(spark, "org.apache.hadoop.fs.*", "org.apache.commons.io.IOUtils")
        self._root = self._jvm.Path(location)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        self.location = location.rstrip("/")
        #: a checkpoint on the driver's own disk: files take their final name with a hard link (:meth:`create`)
        self._local = str(self._fs.getScheme()) == "file"

    def _path(self, rel: str) -> Any:
        return self._jvm.Path(self._root, rel)

    def batch_ids(self, directory: str) -> list[int]:
        """The batch ids with a file in ``directory`` (temporary and checksum files skipped)."""
        path = self._path(directory)
        if not self._fs.exists(path):
            return []
        names = [str(p.getName()) for p in self._jvm.FileUtil.stat2Paths(self._fs.listStatus(path))]
        return sorted(int(n) for n in names if n.isascii() and n.isdigit())

    def exists(self, rel: str) -> bool:
        return bool(self._fs.exists(self._path(rel)))

    def read(self, rel: str) -> str | None:
        path = self._path(rel)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._jvm.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def delete(self, rel: str) -> None:
        """Delete ``rel``; CheckpointError if it is still there.

        Hadoop's ``delete`` reports a failure as ``False``, not as an exception, and a journal file that
        stays would be read again: a jump kept while its chunks are deleted owes its ranges once more.
        """
        path = self._path(rel)
        if not self._fs.delete(path, False) and self._fs.exists(path):
            raise CheckpointError(
                f"cannot delete {self.location}/{rel}: the file system refused (permissions, an immutable or "
                "read-only file?); it must go before the recovery goes on, or its offsets would be read again"
            )

    def create(self, rel: str, text: str) -> bool:
        """Write ``rel`` whole, once: False, and nothing written, when it exists already.

        Two drivers on one checkpoint (a zombie and its replacement) both write the next batch's files;
        the second must find the first's, never replace it, or the survivor's journal and Spark's offset
        log would tell different stories.  The text goes to a temporary file first, then takes the final
        name only if no file has it: a hard link on local disk (``link(2)`` fails on an existing name, in
        one step, where Hadoop's local rename would replace it; a local file system without hard links
        checks for the name, then renames), Hadoop's rename elsewhere (on HDFS it fails on an existing
        name, atomically; an object store checks, then copies).
        """
        final = self._path(rel)
        if self._fs.exists(final):
            return False
        tmp = self._path(f"{rel}.{uuid.uuid4().hex}.tmp")
        stream = self._fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        if self._local:
            try:
                os.link(str(self._fs.pathToFile(tmp).getPath()), str(self._fs.pathToFile(final).getPath()))
            except FileExistsError:
                self._fs.delete(tmp, False)
                return False
            except OSError as exc:  # a local file system without hard links: Hadoop's rename, checked first
                log.warning(
                    "%s/%s: no hard link here (%s); checking for the name, then renaming", self.location, rel, exc
                )
            else:
                self._fs.delete(tmp, False)  # the temporary name, and its checksum file
                return True
            if self._fs.exists(final):
                self._fs.delete(tmp, False)
                return False
        if self._fs.rename(tmp, final):
            return True
        self._fs.delete(tmp, False)
        if self._fs.exists(final):
            return False
        raise CheckpointError(f"cannot rename {tmp} to {self.location}/{rel}")

    def write(self, rel: str, text: str) -> None:
        """Write ``rel`` whole, once (:meth:`create`); CheckpointError if it exists already."""
        if not self.create(rel, text):
            raise CheckpointError(
                f"{self.location}/{rel} exists already: another driver of this query wrote it, so one runs on "
                "this checkpoint now; this one stops here and leaves the checkpoint to it"
            )
