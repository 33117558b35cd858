"""Images attached to the message being written: the Image… button, drag and drop, paste, the tray of
thumbnails above the prompt box.

Every way in (a file picked, image files or a picture dropped on the pane, an image pasted into the
prompt box) goes through app.core.images.attach_bytes / attach_file, so a bad image (corrupt, too big,
an unsupported format) is refused at once with a message naming it, not when the message is sent. The
tray shows each attachment as a thumbnail with its size and a remove button, and how many prompt tokens
the images cost where the backend knows; it hides when nothing is attached.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QMimeData, QObject, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QLayout, QSizePolicy, QToolButton, QWidget

from app.chat.pane_widgets import ElidedLabel
from app.core.images import AttachedImage, ImageError, attach_bytes, attach_file, image_tokens, sees_images
from app.preferences.theme import quiet_text

THUMB = 48  # px, the tray's thumbnails
IMAGE_FILES = "Images (*.png *.jpg *.jpeg *.webp *.gif);;All files (*)"
_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")


def thumbnail(image: AttachedImage, side: int) -> QImage:
    """The image scaled to fit side x side (never enlarged); a null QImage if Qt can't read it."""
    q = QImage.fromData(image.data)
    if q.isNull() or (q.width() <= side and q.height() <= side):
        return q
    return q.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)


def _png(q: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    q.save(buf, "PNG")
    return bytes(data.data())


def image_paths(mime: QMimeData) -> list[str]:
    """Local files in a drop or paste that look like images (other files are not ours to take)."""
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(_SUFFIXES)]


def carries_image(mime: QMimeData) -> bool:
    return mime.hasImage() or bool(image_paths(mime))


def shown_images(session, m) -> tuple[list[AttachedImage], str]:
    """What the transcript shows of a message's images: a user message's images and their note (prompt
    tokens where the backend knows them); for a reply, no images and a note for its stats line on those its
    prompt held."""
    msgs = session.messages
    i = next((k for k, x in enumerate(msgs) if x.id == m.id), 0)
    user = m if m.role == "user" else msgs[i - 1] if i > 0 and msgs[i - 1].role == "user" else None
    images = session.images.of(user.id) if user is not None else []
    if not images:
        return [], ""
    cost = image_tokens(session.backend, images, session.settings)
    if m.role == "user":
        return images, (f"{cost:,} tok" if cost is not None else "")
    n = f"{len(images)} image{'s' if len(images) > 1 else ''}"
    if sees_images(session.backend, session.settings) is False:  # its prompt held a note instead
        return [], f"{n} not shown to this text-only model"
    return [], f"prompt incl. {n}" + (f": {cost:,} tok" if cost is not None else "")


class Attachments(QWidget):
    """The images attached to the next message, as a row of thumbnails (hidden when empty)."""

    changed = Signal()
    problem = Signal(str)  # a refused image: the pane shows why

    def __init__(self, parent: QWidget | None = None, tokens: Callable[[list[AttachedImage]], int | None] | None = None,
                 seeing: Callable[[], bool | None] | None = None):
        super().__init__(parent)
        self.images: list[AttachedImage] = []
        self.tokens = tokens  # what the images cost on the chat's model (None: unknown)
        self.seeing = seeing  # whether the chat's model sees images (None: unknown)
        self.button = QToolButton(text="Image…")
        self.button.setToolTip("Attach images to the message (or drop image files on the chat, or paste an image)")
        self.button.clicked.connect(self.pick)
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.setSpacing(4)
        # many thumbnails never widen the pane: the row is clipped instead (pane_widgets' rule)
        self._row.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(0)
        self.summary = ElidedLabel()
        self.summary.setStyleSheet(f"color: {quiet_text().name()}")
        self._filters: list[_DropFilter] = []
        self.refresh()

    # ---- ways in ---------------------------------------------------------------------------------
    def pick(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", IMAGE_FILES)
        self.add_files(paths)

    def add_files(self, paths: list[str]) -> int:
        """Attach image files; each refused one is reported. Returns how many were attached."""
        return self._add([lambda p=p: attach_file(p) for p in paths])

    def add_bytes(self, data: bytes) -> bool:
        return self._add([lambda: attach_bytes(data)]) == 1

    def add_mime(self, mime: QMimeData) -> bool:
        """A drop or a paste: its image files, else its picture (encoded as PNG). False: nothing of ours."""
        paths = image_paths(mime)
        if paths:
            self.add_files(paths)
            return True
        if mime.hasImage():
            q = QImage(mime.imageData())
            if q.isNull():
                self.problem.emit("the pasted image could not be read")
            else:
                self.add_bytes(_png(q))
            return True
        return False

    def _add(self, makers: list) -> int:
        added, problems = 0, []
        for make in makers:
            try:
                self.images.append(make())
                added += 1
            except ImageError as exc:
                problems.append(str(exc))
        if added:
            self.refresh()
            self.changed.emit()
        if problems:
            self.problem.emit("Image not attached: " + "; ".join(problems))
        return added

    def accept_drops(self, *widgets: QWidget) -> None:
        """Take image drops on these widgets (the pane, the transcript's viewport, the prompt box's)."""
        for w in widgets:
            f = _DropFilter(self, w)
            w.setAcceptDrops(True)
            w.installEventFilter(f)
            self._filters.append(f)

    # ---- the tray --------------------------------------------------------------------------------
    def remove(self, index: int) -> None:
        del self.images[index]
        self.refresh()
        self.changed.emit()

    def clear(self) -> None:
        if self.images:
            self.images = []
            self.refresh()
            self.changed.emit()

    def refresh(self) -> None:
        while (item := self._row.takeAt(0)) is not None:
            if item.widget() is not None and item.widget() is not self.summary:
                item.widget().deleteLater()
        for i, image in enumerate(self.images):
            thumb = QLabel()
            thumb.setPixmap(QPixmap.fromImage(thumbnail(image, THUMB)))
            thumb.setToolTip(image.label())
            thumb.setFixedSize(THUMB, THUMB)
            thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
            remove = QToolButton(text="×")
            remove.setToolTip(f"Remove this image ({image.label()})")
            remove.clicked.connect(lambda _c=False, i=i: self.remove(i))
            self._row.addWidget(thumb)
            self._row.addWidget(remove)
        self._row.addWidget(self.summary, 1)
        self.summary.setText(self.summary_text())
        self.setVisible(bool(self.images))

    def summary_text(self) -> str:
        if not self.images:
            return ""
        n = len(self.images)
        text = f"{n} image{'s' if n > 1 else ''} attached"
        if self.seeing is not None and self.seeing() is False:
            return text + " · this chat's model reads text only"
        cost = self.tokens(self.images) if self.tokens is not None else None
        return text + (f" · {cost:,} tok" if cost is not None else " · tokens unknown until sent")


class _DropFilter(QObject):
    def __init__(self, tray: Attachments, parent: QObject):
        super().__init__(parent)
        self.tray = tray

    def eventFilter(self, obj: QObject, e: QEvent) -> bool:  # noqa: N802
        kind = e.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and carries_image(e.mimeData()):
            e.acceptProposedAction()
            return True
        if kind == QEvent.Type.Drop and carries_image(e.mimeData()):
            self.tray.add_mime(e.mimeData())
            e.acceptProposedAction()
            return True
        return False
