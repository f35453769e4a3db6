"""Notices mouse and keyboard input on the window without drawing a frame.

Dear PyGui reads input only inside `render_dearpygui_frame`, and on software GL a frame costs
25-45 ms of CPU, time the training workers lose. So while nobody uses the window the frame loop
draws rarely, and this watcher asks the X server directly (through the GLFW window Dear PyGui
made, and Xlib) whether the pointer moved or a button or key changed over the window: a few
round trips a tick instead of a frame. Input that arrives between frames is not lost either way:
it waits in the X queue until the next frame reads it. Where there is no X11 (Windows, macOS,
Wayland without XWayland), `InputWatch.open` returns None and the loop draws idle frames more
often instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import dearpygui._dearpygui as dpg_native

_GLFW_FOCUSED = 0x00020001


class InputWatch:
    def __init__(self, glfw: ctypes.CDLL, xlib: ctypes.CDLL, display: int, window: int, handle):
        self._glfw, self._xlib = glfw, xlib
        self._display, self._window, self._handle = display, window, handle
        self._pointer: tuple[int, int, int] | None = None
        self._keys = (ctypes.c_char * 32)()
        self._last_keys = b""
        # XQueryPointer's out-parameters, made once: poll runs 20 times a second.
        self._root, self._child = ctypes.c_ulong(), ctypes.c_ulong()
        self._x, self._y, self._root_x, self._root_y = (ctypes.c_int() for _ in range(4))
        self._mask = ctypes.c_uint()
        outs = (self._root, self._child, self._root_x, self._root_y, self._x, self._y, self._mask)
        self._out_refs = [ctypes.byref(v) for v in outs]

    @classmethod
    def open(cls) -> InputWatch | None:
        """A watcher for the window Dear PyGui shows now (call after show_viewport), or None
        where the window is not an X11 one."""
        try:
            glfw = ctypes.CDLL(dpg_native.__file__)  # the already loaded module: same GLFW
            name = ctypes.util.find_library("X11") or "libX11.so.6"
            xlib = ctypes.CDLL(name)
            glfw.glfwGetCurrentContext.restype = ctypes.c_void_p
            glfw.glfwGetX11Display.restype = ctypes.c_void_p
            glfw.glfwGetX11Window.restype = ctypes.c_ulong
            glfw.glfwGetX11Window.argtypes = [ctypes.c_void_p]
            glfw.glfwGetWindowAttrib.argtypes = [ctypes.c_void_p, ctypes.c_int]
            xlib.XQueryPointer.argtypes = [ctypes.c_void_p, ctypes.c_ulong] + [ctypes.c_void_p] * 7
            xlib.XQueryKeymap.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            handle = glfw.glfwGetCurrentContext()
            display = glfw.glfwGetX11Display()  # NULL when GLFW runs on another platform
            if not handle or not display:
                return None
            window = glfw.glfwGetX11Window(handle)
        except (OSError, AttributeError):
            return None
        return cls(glfw, xlib, display, window, handle) if window else None

    def poll(self, width: int, height: int) -> bool:
        """True when, since the last poll, the pointer moved or a button changed over the
        window (width x height), or a key changed while the pointer is over it or the window
        has the keyboard focus."""
        self._xlib.XQueryPointer(self._display, self._window, *self._out_refs)
        x, y = self._x.value, self._y.value
        inside = 0 <= x < width and 0 <= y < height
        pointer = (x, y, self._mask.value)
        moved = self._pointer is not None and pointer != self._pointer and inside
        self._pointer = pointer
        self._xlib.XQueryKeymap(self._display, ctypes.byref(self._keys))
        keys = bytes(self._keys)
        typed = bool(self._last_keys) and keys != self._last_keys
        self._last_keys = keys
        if typed and not inside:
            typed = bool(self._glfw.glfwGetWindowAttrib(self._handle, _GLFW_FOCUSED))
        return moved or typed
