package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/epochsketch/epochsketch/simulator"
)

// runSimulator serves the browser simulator on localhost until interrupted,
// or writes its folder with -export.
func runSimulator(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("simulator", flag.ContinueOnError)
	addr := fl.String("addr", "localhost:8765", "address to serve on (port 0 picks a free one)")
	dir := fl.String("dir", "", "serve this folder instead of the built-in one (e.g. one made by go generate ./simulator)")
	export := fl.String("export", "", "write the simulator folder to `DIR` and exit: any static server can serve it")
	if err := parse(fl, args, stderr); err != nil {
		return err
	}
	files := simulator.FS()
	if *dir != "" {
		files = os.DirFS(*dir)
		for _, f := range simulator.Files {
			if _, err := fs.Stat(files, f); err != nil {
				return fmt.Errorf("-dir %s: %w (the folder needs %v)", *dir, err, simulator.Files)
			}
		}
	}
	if *export != "" {
		return exportFolder(*export, stdout)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return usageErr("-addr %s: %v", *addr, err)
	}
	srv := &http.Server{
		Handler:           simulator.Handler(files),
		ReadHeaderTimeout: 5 * time.Second,
	}
	fmt.Fprintf(stdout, "serving the EpochSketch simulator at http://%s/ (Ctrl-C stops)\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	fmt.Fprintln(stdout, "stopped")
	return nil
}

// exportFolder writes the embedded simulator to dir, creating it.
func exportFolder(dir string, stdout io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range simulator.Files {
		b, err := fs.ReadFile(simulator.FS(), f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "wrote %v to %s; serve the folder and open %s\n", simulator.Files, dir, simulator.Page)
	return nil
}
